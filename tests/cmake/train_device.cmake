# Training and evaluation on the device backends (src/train/backend.c): the emulated device
# against cpu, bit for bit (losses, checkpoint bytes, eval), and --device cuda without a GPU
# failing with a hint (the qctrain binary included). test_train_device_cuda (label gpu): cuda
# against cpu within a stated tolerance, two cuda runs bit-identical; exit 77 without a GPU.
qc_add_test(test_train_device SOURCES test_train_device.c LIBS qctrainer qcmodel qcdata qcconfig
    LABELS cpu TIMEOUT 600 ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
add_dependencies(test_train_device qctrain)
add_test(NAME test_train_device_cuda COMMAND test_train_device cuda)
set_tests_properties(test_train_device_cuda PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77
    TIMEOUT 600 ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
