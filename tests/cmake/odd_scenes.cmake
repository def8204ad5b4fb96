# Odd but valid scenes (no map, nothing predicted, no valid step, extreme coordinates, no focal
# agent) through train and eval on cpu and emu, fused and unfused (docs/RELIABILITY.md).
qc_add_test(test_odd_scenes SOURCES test_odd_scenes.c LIBS qctrainer qcmodel qcdata qcconfig m
    LABELS cpu TIMEOUT 300 ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
