# Synthetic AV2-like scenes: determinism, statistics per profile, structural validity.
qc_add_test(test_synth SOURCES test_synth.c LIBS qcdata m LABELS cpu TIMEOUT 300)
