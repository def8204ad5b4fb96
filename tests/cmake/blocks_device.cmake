# QCNet blocks on the device backends (src/model): FourierEmbedding and MLPLayer forward and
# backward on the emulated device are bit-identical to CPU (label cpu); the same source with
# ARGS cuda compares a CUDA device to CPU within tolerance (label gpu; exits 77 without a GPU
# or in a CPU-only build).
qc_add_test(test_blocks_device SOURCES test_blocks_device.c LIBS qcmodel m LABELS cpu TIMEOUT 300)
qc_add_test(test_blocks_device_cuda SOURCES test_blocks_device.c LIBS qcmodel m LABELS gpu
            ARGS cuda TIMEOUT 300)
