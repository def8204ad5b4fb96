/*
 * linear.cu — y = x·Wᵀ + b through cuBLAS (fp32; TF32 when the context asks), the CPU op's
 * exact interface (kernels/cpu/linear.c): bias first written (or added) into out, then one GEMM
 * with beta = 1. Row-major (N,OC) is column-major (OC,N), so out = Wᵀ·x in cuBLAS terms.
 * dbias is a deterministic column reduction (colsum, double accumulators).
 *
 * 16-bit GEMMs (train.precision, docs/PRECISION.md): the _prec entry points with bf16 / fp16
 * (and the GRU, through cuda_linear_*_lowp) first round the operands the CPU oracle rounds
 * (kernels/exec.c: the weight, the input rows, the output gradient) to the precision, with
 * qc_half.h's rounding, the oracle's bits, into the workspace's area (qc_lowp_gemm.h: cuBLAS
 * keeps the first half of the workspace meanwhile). A GEMM whose two operands are both rounded
 * then runs through cublasGemmEx on those fp32 buffers with compute type
 * CUBLAS_COMPUTE_32F_FAST_16BF (bf16) or _FAST_16F (fp16): cuBLAS may convert them to 16 bits
 * (or TF32) for the tensor cores, exact either way because every value is a 16-bit value, and
 * accumulates in fp32. A GEMM with an operand the oracle keeps in fp32 (the GRU's hidden state
 * and gate gradients) stays cublasSgemm on the rounded other operand. The operands are never
 * left to cuBLAS's own down-conversion, whose rounding cuBLAS does not specify (it may even
 * choose TF32). In fp32 every GEMM is cublasSgemm on the operands as given.
 */
#include "cuda_common.cuh"
#include "qc_half.h"
#include "qc_lowp_gemm.h"

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

/* The bias part of a forward: out (=|+=) bias when bias is given (the GEMM then adds into out),
 * returning the GEMM's beta: 1 when out already holds a term, else 0. */
static float bias_first(float *out, const float *bias, int64_t N, int64_t OC, bool accum,
                        cudaStream_t stream)
{
    if (!bias)
        return accum ? 1.0f : 0.0f;
    bias_rows_kernel<<<cuda_blocks(N * OC, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, bias, N, OC,
                                                                                 accum);
    QC_CUDA_LAUNCH_CHECK();
    return 1.0f;
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
    if (prec != QC_PREC_FP32) { /* the oracle rounds both operands (kernels/exec.c) */
        cuda_linear_forward_lowp(out, inp, ldi, weight, bias, N, IC, OC, accum, prec,
                                 CUDA_LOWP_INP | CUDA_LOWP_W, stream);
        return;
    }
    QC_ASSERT(N >= 0 && IC > 0 && OC > 0 && ldi >= IC,
              "linear fwd cuda: N %lld IC %lld OC %lld ldi %lld", (long long)N, (long long)IC,
              (long long)OC, (long long)ldi);
    QC_ASSERT(N == 0 || (out && inp && weight), "linear fwd cuda: NULL tensor");
    if (N == 0)
        return;
    check_blas_dims(N, IC, OC, ldi);
    struct qc_kernels_cuda *ctx = cuda_ctx_bind(stream, "linear fwd cuda");
    const float beta = bias_first(out, bias, N, OC, accum, stream);
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
    if (prec != QC_PREC_FP32) { /* the oracle rounds inp, weight and dout (kernels/exec.c) */
        cuda_linear_backward_lowp(dinp, lddi, dweight, dbias, dout, inp, ldi, weight, N, IC, OC,
                                  accum, prec, CUDA_LOWP_INP | CUDA_LOWP_W | CUDA_LOWP_DOUT,
                                  stream);
        return;
    }
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

// ---- 16-bit GEMMs: the rounded operands in the workspace's area -----------------------------

/* dst (rows, cols) contiguous = src (rows, cols; leading dimension ld) rounded to prec. */
static __global__ void round_rows_kernel(float *dst, const float *src, int64_t rows, int64_t cols,
                                         int64_t ld, int prec)
{
    const int64_t total = rows * cols;
    for (int64_t i = cuda_tid(); i < total; i += cuda_nthreads()) {
        const int64_t r = i / cols, c = i % cols;
        dst[i] = qc_round_prec(src[r * ld + c], prec);
    }
}

static void round_rows(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld,
                       int prec, cudaStream_t stream)
{
    if (rows * cols == 0)
        return;
    round_rows_kernel<<<cuda_blocks(rows * cols, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        dst, src, rows, cols, ld, prec);
    QC_CUDA_LAUNCH_CHECK();
}

/* The area for one 16-bit op (qc_lowp_gemm.h), planned for the operands it rounds (w, inp,
 * dout) into *p: cuBLAS gets the first part of ctx's workspace until lowp_area_end. Everything
 * the op enqueues runs on one stream, in order, so a chunk's rounding never overtakes the
 * previous chunk's GEMM, and nothing after the op (a column sum, a GEMM with the whole
 * workspace) overtakes its GEMMs. */
static float *lowp_area_begin(struct qc_kernels_cuda *ctx, int64_t N, int64_t IC, int64_t OC,
                              bool w, bool inp, bool dout, struct qc_lowp_plan *p, const char *op)
{
    const size_t blas = qc_lowp_blas_bytes(ctx->ws_bytes);
    const int64_t area_n = qc_lowp_area_numel(ctx->ws_bytes);
    QC_ASSERT(qc_lowp_plan_make(area_n, N, IC, OC, w, inp, dout, p),
              "%s: the op context's workspace (%zu bytes) leaves %lld floats for the 16-bit "
              "operands; a %lld x %lld weight and one row need more\n"
              "hint: give the context QC_KERNELS_CUDA_WORKSPACE_BYTES of workspace",
              op, ctx->ws_bytes, (long long)area_n, (long long)OC, (long long)IC);
    QC_CUBLAS_ASSERT(cublasSetWorkspace(ctx->cublas, ctx->ws, blas));
    return (float *)((char *)ctx->ws + blas);
}

static void lowp_area_end(struct qc_kernels_cuda *ctx)
{
    QC_CUBLAS_ASSERT(cublasSetWorkspace(ctx->cublas, ctx->ws, ctx->ws_bytes));
}

/* The rows a 16-bit GEMM reads of one operand: src (rows, cols; leading dimension *ld) rounded
 * to prec into dst when rnd (*ld becomes cols), else src as it is. */
static const float *lowp_rows(float *dst, const float *src, int64_t rows, int64_t cols, int64_t *ld,
                              bool rnd, int prec, cudaStream_t stream)
{
    if (!rnd)
        return src;
    round_rows(dst, src, rows, cols, *ld, prec, stream);
    *ld = cols;
    return dst;
}

void cuda_linear_forward_lowp(float *out, const float *inp, int64_t ldi, const float *weight,
                              const float *bias, int64_t N, int64_t IC, int64_t OC, bool accum,
                              int prec, unsigned rnd, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && IC > 0 && OC > 0 && ldi >= IC,
              "linear fwd cuda (16-bit): N %lld IC %lld OC %lld ldi %lld", (long long)N,
              (long long)IC, (long long)OC, (long long)ldi);
    QC_ASSERT(N == 0 || (out && inp && weight), "linear fwd cuda (16-bit): NULL tensor");
    QC_ASSERT((prec == QC_PREC_BF16 || prec == QC_PREC_FP16) &&
                  (rnd & ~(unsigned)(CUDA_LOWP_INP | CUDA_LOWP_W)) == 0,
              "linear fwd cuda (16-bit): precision %d, rounding flags %#x", prec, rnd);
    if (N == 0)
        return;
    check_blas_dims(N, IC, OC, ldi);
    struct qc_kernels_cuda *ctx = cuda_ctx_bind(stream, "linear fwd cuda (16-bit)");
    /* as the fp32 path: bias (or out + bias) first, then the GEMM adds */
    const float beta = bias_first(out, bias, N, OC, accum, stream);
    const float alpha = 1.0f;
    const bool r_inp = (rnd & CUDA_LOWP_INP) != 0, r_w = (rnd & CUDA_LOWP_W) != 0;
    /* 16-bit products only when both operands are 16-bit values */
    const int gp = r_inp && r_w ? prec : QC_PREC_FP32;
    struct qc_lowp_plan p;
    float *area =
        lowp_area_begin(ctx, N, IC, OC, r_w, r_inp, false, &p, "linear fwd cuda (16-bit)");
    int64_t ldw = IC;
    const float *w = lowp_rows(area + p.w_off, weight, OC, IC, &ldw, r_w, prec, stream);
    for (int64_t n0 = 0; n0 < N; n0 += p.rows) {
        const int64_t nc = N - n0 < p.rows ? N - n0 : p.rows;
        int64_t ldx = ldi;
        const float *x =
            lowp_rows(area + p.inp_off, inp + n0 * ldi, nc, IC, &ldx, r_inp, prec, stream);
        /* column-major: out[:, n0 .. n0+nc) (OC x nc) = W^T (OC x IC) · x (IC x nc, ld ldx) */
        gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, (int)OC, (int)nc, (int)IC, &alpha, w, (int)IC, x,
             (int)ldx, &beta, out + n0 * OC, (int)OC, gp);
    }
    lowp_area_end(ctx);
}

void cuda_linear_backward_lowp(float *dinp, int64_t lddi, float *dweight, float *dbias,
                               const float *dout, const float *inp, int64_t ldi,
                               const float *weight, int64_t N, int64_t IC, int64_t OC, bool accum,
                               int prec, unsigned rnd, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && IC > 0 && OC > 0 && ldi >= IC && (!dinp || lddi >= IC),
              "linear bwd cuda (16-bit): N %lld IC %lld OC %lld ldi %lld lddi %lld", (long long)N,
              (long long)IC, (long long)OC, (long long)ldi, (long long)lddi);
    QC_ASSERT((prec == QC_PREC_BF16 || prec == QC_PREC_FP16) &&
                  (rnd & ~(unsigned)(CUDA_LOWP_INP | CUDA_LOWP_W | CUDA_LOWP_DOUT)) == 0,
              "linear bwd cuda (16-bit): precision %d, rounding flags %#x", prec, rnd);
    if (N == 0)
        return;
    QC_ASSERT(dout, "linear bwd cuda (16-bit): NULL dout");
    QC_ASSERT(!dinp || weight, "linear bwd cuda (16-bit): dinp needs weight");
    QC_ASSERT(!dweight || inp, "linear bwd cuda (16-bit): dweight needs inp");
    check_blas_dims(N, IC, OC, ldi);
    if (dinp)
        check_blas_dims(N, IC, OC, lddi);
    struct qc_kernels_cuda *ctx = cuda_ctx_bind(stream, "linear bwd cuda (16-bit)");
    const float one = 1.0f;
    if (dinp || dweight) {
        /* only the operands a requested GEMM reads */
        const bool r_w = dinp && (rnd & CUDA_LOWP_W) != 0;
        const bool r_inp = dweight && (rnd & CUDA_LOWP_INP) != 0;
        const bool r_d = (rnd & CUDA_LOWP_DOUT) != 0;
        const int gp_dinp = r_w && r_d ? prec : QC_PREC_FP32;
        const int gp_dw = r_inp && r_d ? prec : QC_PREC_FP32;
        const float beta = accum ? 1.0f : 0.0f;
        struct qc_lowp_plan p;
        float *area =
            lowp_area_begin(ctx, N, IC, OC, r_w, r_inp, r_d, &p, "linear bwd cuda (16-bit)");
        int64_t ldw = IC;
        const float *w = lowp_rows(area + p.w_off, weight, OC, IC, &ldw, r_w, prec, stream);
        for (int64_t n0 = 0; n0 < N; n0 += p.rows) {
            const int64_t nc = N - n0 < p.rows ? N - n0 : p.rows;
            int64_t ldg = OC;
            const float *g =
                lowp_rows(area + p.dout_off, dout + n0 * OC, nc, OC, &ldg, r_d, prec, stream);
            if (dinp) /* column-major: dinp[:, n0 ..) (IC x nc, ld lddi) = W (IC x OC) · g */
                gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, (int)IC, (int)nc, (int)OC, &one, w, (int)IC, g,
                     (int)OC, &beta, dinp + n0 * lddi, (int)lddi, gp_dinp);
            if (dweight) {
                int64_t ldx = ldi;
                const float *x =
                    lowp_rows(area + p.inp_off, inp + n0 * ldi, nc, IC, &ldx, r_inp, prec, stream);
                /* column-major: dW (IC x OC) += x (IC x nc) · g^T (nc x OC): the chunks'
                 * partial sums added in ascending chunk order */
                gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, (int)IC, (int)OC, (int)nc, &one, x, (int)ldx, g,
                     (int)OC, &one, dweight, (int)IC, gp_dw);
            }
        }
        lowp_area_end(ctx);
    }
    if (dbias) { /* the oracle sums the fp32 output gradient; after the GEMMs (whole workspace) */
        struct dbias_fn f = {dout, OC};
        colsum_launch<1>(ctx, dbias, NULL, N, OC, f, stream);
    }
}
