# The profiler (src/base/qc_prof.h) and `qctrain profile`'s trace and summary (src/prof): two
# training steps of a tiny model with the recorder on and off give the same bits; the trace is
# valid Chrome trace JSON with the expected events; nesting and attribution invariants. Two
# threads, so the fused attention's tiles run as a team.
qc_add_test(test_profile SOURCES test_profile.c
    LIBS qcprof qctrainer qcmodel qcdata qcconfig PkgConfig::CJSON LABELS cpu
    TIMEOUT 600 ENV "OMP_NUM_THREADS=2")
