/*
 * linear.cu — y = x·Wᵀ + b through cuBLAS (fp32; TF32 when the context asks), the CPU op's
 * exact interface (kernels/cpu/linear.c): bias first written (or added) into out, then one GEMM
 * with beta = 1. Row-major (N,OC) is column-major (OC,N), so out = Wᵀ·x in cuBLAS terms.
 * dbias is a deterministic column reduction (colsum, double accumulators).
 *
 * 16-bit GEMMs (train.precision, docs/PRECISION.md): the _prec entry points run every GEMM of
 * the op through cublasGemmEx with fp32 matrices and compute type CUBLAS_COMPUTE_32F_FAST_16BF
 * (bf16) or _FAST_16F (fp16): cuBLAS converts A and B to 16 bits and multiplies on the tensor
 * cores, accumulating in fp32. The exec layer hands them operands already rounded to the
 * precision (the CPU op rounds the same operands, kernels/exec.c), so the conversion is exact
 * and only the accumulation order differs from the CPU's.
 */
#include "cuda_common.cuh"
#include "qc_half.h"

#include <limits.h>

static void check_blas_dims(int64_t a, int64_t b, int64_t c, int64_t ld)
{
    QC_ASSERT(a <= INT_MAX && b <= INT_MAX && c <= INT_MAX && ld <= INT_MAX,
              "linear cuda: dims %lld x %lld x %lld (ld %lld) exceed the cuBLAS int range",
              (long long)a, (long long)b, (long long)c, (long long)ld);
}

/* C = alpha·op(A)·op(B) + beta·C, column-major, all fp32 in memory: cublasSgemm for fp32 (TF32
 * when the context's math mode allows it), else the 16-bit tensor-core compute type of prec. */
static void gemm(struct qc_kernels_cuda *ctx, cublasOperation_t ta, cublasOperation_t tb, int m,
                 int n, int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                 const float *beta, float *C, int ldc, int prec)
{
    if (prec == QC_PREC_FP32) {
        QC_CUBLAS_ASSERT(
            cublasSgemm(ctx->cublas, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc));
        return;
    }
    QC_ASSERT(prec == QC_PREC_BF16 || prec == QC_PREC_FP16, "linear cuda: precision %d", prec);
    const cublasComputeType_t compute =
        prec == QC_PREC_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_16F;
    QC_CUBLAS_ASSERT(cublasGemmEx(ctx->cublas, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B,
                                  CUDA_R_32F, ldb, beta, C, CUDA_R_32F, ldc, compute,
                                  CUBLAS_GEMM_DEFAULT));
}

/* out[n, c] (=|+=) bias[c] over (N,OC). */
static __global__ void bias_rows_kernel(float *out, const float *bias, int64_t N, int64_t OC,
                                        bool accum)
{
    int64_t total = N * OC;
    for (int64_t i = cuda_tid(); i < total; i += cuda_nthreads()) {
        float b = bias[i % OC];
        out[i] = accum ? out[i] + b : b;
    }
}

void qc_linear_forward_cuda(float *out, const float *inp, int64_t ldi, const float *weight,
                            const float *bias, int64_t N, int64_t IC, int64_t OC, bool accum,
                            cudaStream_t stream)
{
    qc_linear_forward_prec_cuda(out, inp, ldi, weight, bias, N, IC, OC, accum, QC_PREC_FP32,
                                stream);
}

void qc_linear_forward_prec_cuda(float *out, const float *inp, int64_t ldi, const float *weight,
                                 const float *bias, int64_t N, int64_t IC, int64_t OC, bool accum,
                                 int prec, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && IC > 0 && OC > 0 && ldi >= IC,
              "linear fwd cuda: N %lld IC %lld OC %lld ldi %lld", (long long)N, (long long)IC,
              (long long)OC, (long long)ldi);
    QC_ASSERT(N == 0 || (out && inp && weight), "linear fwd cuda: NULL tensor");
    if (N == 0)
        return;
    check_blas_dims(N, IC, OC, ldi);
    struct qc_kernels_cuda *ctx = cuda_ctx_bind(stream, "linear fwd cuda");
    float beta = accum ? 1.0f : 0.0f;
    if (bias) {
        bias_rows_kernel<<<cuda_blocks(N * OC, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, bias, N,
                                                                                     OC, accum);
        QC_CUDA_LAUNCH_CHECK();
        beta = 1.0f;
    }
    const float alpha = 1.0f;
    /* column-major: out (OC x N) = W^T (OC x IC) · inp (IC x N, ld ldi) */
    gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, (int)OC, (int)N, (int)IC, &alpha, weight, (int)IC, inp,
         (int)ldi, &beta, out, (int)OC, prec);
}

/* colsum functor: dout[n, c] */
struct dbias_fn {
    const float *dout;
    int64_t OC;
    __device__ void operator()(int64_t n, int64_t c, double *v) const
    {
        v[0] = (double)dout[n * OC + c];
    }
};

void qc_linear_backward_cuda(float *dinp, int64_t lddi, float *dweight, float *dbias,
                             const float *dout, const float *inp, int64_t ldi, const float *weight,
                             int64_t N, int64_t IC, int64_t OC, bool accum, cudaStream_t stream)
{
    qc_linear_backward_prec_cuda(dinp, lddi, dweight, dbias, dout, inp, ldi, weight, N, IC, OC,
                                 accum, QC_PREC_FP32, stream);
}

void qc_linear_backward_prec_cuda(float *dinp, int64_t lddi, float *dweight, float *dbias,
                                  const float *dout, const float *inp, int64_t ldi,
                                  const float *weight, int64_t N, int64_t IC, int64_t OC,
                                  bool accum, int prec, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && IC > 0 && OC > 0 && ldi >= IC && (!dinp || lddi >= IC),
              "linear bwd cuda: N %lld IC %lld OC %lld ldi %lld lddi %lld", (long long)N,
              (long long)IC, (long long)OC, (long long)ldi, (long long)lddi);
    if (N == 0)
        return;
    QC_ASSERT(dout, "linear bwd cuda: NULL dout");
    check_blas_dims(N, IC, OC, ldi);
    struct qc_kernels_cuda *ctx = cuda_ctx_bind(stream, "linear bwd cuda");
    const float one = 1.0f;
    if (dinp) {
        QC_ASSERT(weight, "linear bwd cuda: dinp needs weight");
        check_blas_dims(N, IC, OC, lddi);
        const float beta = accum ? 1.0f : 0.0f;
        /* column-major: dinp (IC x N, ld lddi) = W (IC x OC) · dout (OC x N) */
        gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, (int)IC, (int)N, (int)OC, &one, weight, (int)IC, dout,
             (int)OC, &beta, dinp, (int)lddi, prec);
    }
    if (dweight) {
        QC_ASSERT(inp, "linear bwd cuda: dweight needs inp");
        /* column-major: dW (IC x OC) += inp (IC x N, ld ldi) · dout^T (N x OC) */
        gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, (int)IC, (int)OC, (int)N, &one, inp, (int)ldi, dout,
             (int)OC, &one, dweight, (int)IC, prec);
    }
    if (dbias) {
        struct dbias_fn f = {dout, OC};
        colsum_launch<1>(ctx, dbias, NULL, N, OC, f, stream);
    }
}
