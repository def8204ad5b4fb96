# The attention layer (src/model/attention_*.c) on every backend, FUSED and UNFUSED.
#   test_attn_device (cpu): CPU vs the emulated device (qc_emu.h), bit for bit; any host read of
#     device memory by the layers faults.
#   test_attn_device_cuda (gpu): CPU vs CUDA within tolerance; exits 77 without a GPU and in a
#     CPU-only build.
qc_add_test(test_attn_device SOURCES test_attn_device.c LIBS qcmodel m LABELS cpu TIMEOUT 300)
qc_add_test(test_attn_device_cuda SOURCES test_attn_device.c LIBS qcmodel m LABELS gpu
            TIMEOUT 300 ARGS cuda)
