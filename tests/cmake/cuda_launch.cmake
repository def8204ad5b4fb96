# The CUDA kernels' launch arithmetic (kernels/qc_cuda_launch.h) on the CPU: the column
# reduction's grids cover every column and row within CUDA's limits (also past 4.19 M columns).
# Runs in every build, no GPU needed.
qc_add_test(test_cuda_launch SOURCES test_cuda_launch.c LIBS qckernels LABELS cpu TIMEOUT 60)
