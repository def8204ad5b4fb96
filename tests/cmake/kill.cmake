# Crash consistency (docs/RELIABILITY.md): SIGKILL a training run (the qctrain binary, a small
# cpu-smoke configuration, --save-every 1) at least 10 times at fixed-seed moments, some inside
# checkpoint writes, resume each time; the final checkpoint must equal an uninterrupted run's.
qc_add_test(test_kill SOURCES test_kill.c LIBS qcbase LABELS cpu TIMEOUT 300
    ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_dependencies(test_kill qctrain)
