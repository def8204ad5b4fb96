# The whole QCNet model (src/model/qc_qcnet.h): state_dict table, parity with the official
# PyTorch numbers on ../shared/data/qcnet-parity-tiny (both attention implementations),
# checkpoints, initialisation, allocation hook, metrics, deterministic training. One thread:
# the tiny config's ops (D 32) are dominated by OpenMP fork/join on a loaded 2-core machine.
qc_add_test(test_model SOURCES test_model.c LIBS qcmodel qcdata m LABELS cpu TIMEOUT 600
    ENV OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
