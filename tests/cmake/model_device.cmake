# The model on the device backends (qc_qcnet_create_on, kernels/qc_exec.h).
#   test_model_device (cpu): the emulated device (base/qc_emu.h) against the CPU, bit for bit,
#     on the parity-tiny model and a synthetic batch, fused and unfused; host access (init,
#     checkpoints, set_alloc) and allocation failures on the emulated device. One thread, as
#     test_model.
#   test_model_device_cuda (gpu): the same cases on CUDA against the CPU within tolerance, and
#     two CUDA runs bit-identical; exits 77 without a GPU or in a CPU-only build.
#   Under the sanitizers (.ci/run's asan step) the EMU == CPU bit-for-bit cases are left out:
#   they check numbers, not memory, cost ~7 minutes there, and test_train_device trains the same
#   model on EMU under the sanitizers; refusals, host access and allocation failures stay.
set(qc_model_device_env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
if(QC_SANITIZE)
    list(APPEND qc_model_device_env "QC_TEST_EXCLUDE=EMU == CPU bit for bit")
endif()
qc_add_test(test_model_device SOURCES test_model_device.c LIBS qcmodel qcdata qckernels qcalloc m
    LABELS cpu TIMEOUT 900 ENV ${qc_model_device_env})
add_test(NAME test_model_device_cuda COMMAND test_model_device cuda)
set_tests_properties(test_model_device_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77
    TIMEOUT 900 ENVIRONMENT "QC_PROFILES_DIR=${PROJECT_SOURCE_DIR}/profiles")
