/*
 * cuda_common.cuh — private helpers shared by the kernels/cuda sources: error conversion for cuBLAS
 * and cuDNN (QC_CUBLAS, QC_CUDNN, built on QC_CHECK_GEN like QC_CUDA), the context internals,
 * launch-shape helpers, the CSR item accessor and the deterministic column reduction.
 *
 * Never included by C code or outside kernels/.
 *
 * Glossary:
 *   grid-stride  a kernel loop `for (i = tid; i < n; i += nthreads)`: any grid covers any n.
 *   colsum       out[c] += Σ_n f(n, c) over rows in a fixed two-level order (row chunks of a
 *                size that depends only on N, then the chunks in ascending order), double
 *                accumulators, the partials in the context's workspace. No atomics.
 */
#ifndef QC_KERNELS_CUDA_COMMON_CUH
#define QC_KERNELS_CUDA_COMMON_CUH

#include <pthread.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "qc_cuda_check.h"
#include "qc_cuda_launch.h"
#include "qc_kernels.h"
#include "qc_kernels_cuda.h"
#include "qc_status.h"

// ---- error conversion -------------------------------------------------------------------------

enum qc_status qc_cublas_check(cublasStatus_t st, const char *call, const char *file, int line);
enum qc_status qc_cudnn_check(cudnnStatus_t st, const char *call, const char *file, int line);
void qc_cublas_assert(cublasStatus_t st, const char *call, const char *file, int line);
void qc_cudnn_assert(cudnnStatus_t st, const char *call, const char *file, int line);

#define QC_CUBLAS(call)        QC_CHECK_GEN(call, qc_cublas_check)
#define QC_CUDNN(call)         QC_CHECK_GEN(call, qc_cudnn_check)
#define QC_CUBLAS_ASSERT(call) qc_cublas_assert((call), #call, __FILE__, __LINE__)
#define QC_CUDNN_ASSERT(call)  qc_cudnn_assert((call), #call, __FILE__, __LINE__)

/* Launch-error check after every kernel launch (STYLE.md §3). */
#define QC_CUDA_LAUNCH_CHECK() QC_CUDA_ASSERT(cudaGetLastError())

// ---- context internals -----------------------------------------------------------------------

struct qc_kernels_cuda {
    int device;            /* CUDA ordinal */
    bool tf32;             /* cuBLAS math mode TF32 tensor-op (true) or default fp32 */
    cublasHandle_t cublas; /* created with the context */
    cudnnHandle_t cudnn;   /* created on first use (NULL until then) */
    double *ws;            /* workspace (caller's memory): colsum partials and cuBLAS's */
    size_t ws_bytes;       /* its size */
    cudaEvent_t join;      /* orders a stream switch after the previous stream's work */
    /* mu guards last_stream / has_last: a stream destroyed on another thread clears them
     * (the stream-destroy listener, qc_device.h) */
    pthread_mutex_t mu;
    cudaStream_t last_stream;          /* stream of the previous launch through this context */
    bool has_last;                     /* last_stream is valid (a live stream) */
    struct qc_kernels_cuda *next_live; /* in handles.cu's list of live contexts */
    /* upload staging ring (qc_upload_cuda; stage NULL: none) */
    unsigned char *stage;                                  /* caller's pinned memory */
    size_t stage_slot;                                     /* bytes of one slot */
    unsigned int stage_next;                               /* the slot the next chunk takes */
    cudaEvent_t stage_done[QC_KERNELS_CUDA_STAGING_SLOTS]; /* the slot's last copy finished */
};

/* This thread's context, bound to `stream`: if the stream differs from the previous one, the
 * new stream waits for the old one's work so far (the workspace and handle are shared); the
 * cuBLAS handle is set to `stream` and given the workspace. Aborts with a hint when no context
 * is current. */
struct qc_kernels_cuda *cuda_ctx_bind(cudaStream_t stream, const char *op);
/* The lazily created cuDNN handle of ctx, bound to `stream`. */
enum qc_status cuda_ctx_cudnn(struct qc_kernels_cuda *ctx, cudaStream_t stream, cudnnHandle_t *out);

// ---- 16-bit GEMMs (linear.cu) -----------------------------------------------------------------
/* The linear op with some of its operands rounded to prec (bf16 or fp16) first, as the CPU oracle
 * rounds them (kernels/exec.c): CUDA_LOWP_INP the input rows, CUDA_LOWP_W the weight,
 * CUDA_LOWP_DOUT the output gradient (never the bias gradient's: it sums the fp32 dout). A GEMM
 * whose operands are both rounded runs on the tensor cores (fp32 accumulation), any other in
 * fp32 (cublasSgemm). Arguments and ACCUM / OVERWRITE otherwise those of
 * qc_linear_{forward,backward}_cuda. The rounded operands live in the workspace's area
 * (qc_lowp_gemm.h); an area too small for the weight and one row aborts with a hint. */
enum { CUDA_LOWP_INP = 1u, CUDA_LOWP_W = 2u, CUDA_LOWP_DOUT = 4u };

void cuda_linear_forward_lowp(float *out, const float *inp, int64_t ldi, const float *weight,
                              const float *bias, int64_t N, int64_t IC, int64_t OC, bool accum,
                              int prec, unsigned rnd, cudaStream_t stream);
void cuda_linear_backward_lowp(float *dinp, int64_t lddi, float *dweight, float *dbias,
                               const float *dout, const float *inp, int64_t ldi,
                               const float *weight, int64_t N, int64_t IC, int64_t OC, bool accum,
                               int prec, unsigned rnd, cudaStream_t stream);

// ---- launch shapes ----------------------------------------------------------------------------
/* The arithmetic lives in qc_cuda_launch.h (plain C: tests/test_cuda_launch.c checks it on the
 * CPU build). */

#define CUDA_BLOCK      QC_CUDA_BLOCK
#define CUDA_MAX_BLOCKS QC_CUDA_MAX_BLOCKS

/* Blocks for n work items of `block` threads each (n > 0), capped: kernels are grid-stride. */
static inline unsigned int cuda_blocks(int64_t n, int block)
{
    return qc_cuda_blocks(n, block);
}

/* Global thread id and thread count of a 1-D grid, as int64. */
__device__ static inline int64_t cuda_tid(void)
{
    return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ static inline int64_t cuda_nthreads(void)
{
    return (int64_t)gridDim.x * blockDim.x;
}

/* Item k of a CSR in segment order. */
__device__ static inline int64_t csr_item(const int64_t *perm, int64_t k)
{
    return perm ? perm[k] : k;
}

/* Host-side CSR sanity (what the CPU ops assert, minus reading device arrays). */
static inline void cuda_csr_check(const struct qc_csr *csr, const char *op)
{
    QC_ASSERT(csr->nseg >= 0 && csr->nitem >= 0 && csr->ptr, "%s: bad csr (nseg %lld nitem %lld)",
              op, (long long)csr->nseg, (long long)csr->nitem);
}

/* Dropout multiplier of element `index` of a site: scale when kept, 0 when dropped. */
__device__ static inline float cuda_drop_factor(uint64_t seed, uint32_t step, uint32_t block,
                                                int64_t index, float p, float scale)
{
    return qc_dropout_keep(seed, step, block, index, p) ? scale : 0.0f;
}

/* Warp sum of a double in a fixed butterfly order (all lanes get the same value). */
__device__ static inline double warp_sum_double(double v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// ---- deterministic column reduction ------------------------------------------------------------

#define COLSUM_TX QC_COLSUM_TX /* columns per block */
#define COLSUM_TY QC_COLSUM_TY /* row lanes per block */

/* Level 1: partial[k][chunk][c - c0] = Σ_{rows of chunk} f(n, c)[k]. Each thread walks rows
 * r0 + ty, r0 + ty + TY, ... in order; the TY lanes are then added in ascending ty. */
template <int NOUT, class F>
__global__ void colsum_partial_kernel(double *partial, int64_t N, int64_t c0, int64_t cs,
                                      int64_t rows_per_chunk, int64_t nchunk, F f)
{
    __shared__ double sh[NOUT][COLSUM_TY][COLSUM_TX];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t cl = (int64_t)blockIdx.x * COLSUM_TX + tx; /* column within the slab */
    int64_t chunk = blockIdx.y;
    int64_t r0 = chunk * rows_per_chunk;
    int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
    double acc[NOUT];
    for (int k = 0; k < NOUT; k++)
        acc[k] = 0.0;
    if (cl < cs) {
        for (int64_t n = r0 + ty; n < r1; n += COLSUM_TY) {
            double v[NOUT];
            f(n, c0 + cl, v);
            for (int k = 0; k < NOUT; k++)
                acc[k] += v[k];
        }
    }
    for (int k = 0; k < NOUT; k++)
        sh[k][ty][tx] = acc[k];
    __syncthreads();
    if (ty == 0 && cl < cs) {
        for (int k = 0; k < NOUT; k++) {
            double t = sh[k][0][tx];
            for (int j = 1; j < COLSUM_TY; j++)
                t += sh[k][j][tx];
            partial[((int64_t)k * nchunk + chunk) * cs + cl] = t;
        }
    }
}

/* Level 2: out[k][c] += (float)Σ_chunk partial[k][chunk][c - c0], chunks ascending. Grid-stride:
 * the capped grid (qc_cuda_blocks) covers any slab width. */
template <int NOUT>
__global__ void colsum_final_kernel(float *o0, float *o1, const double *partial, int64_t c0,
                                    int64_t cs, int64_t nchunk)
{
    for (int64_t cl = cuda_tid(); cl < cs; cl += cuda_nthreads()) {
        for (int k = 0; k < NOUT; k++) {
            float *o = k == 0 ? o0 : o1;
            if (!o)
                continue;
            double t = 0.0;
            for (int64_t ch = 0; ch < nchunk; ch++)
                t += partial[((int64_t)k * nchunk + ch) * cs + cl];
            o[c0 + cl] += (float)t;
        }
    }
}

/* out_k[c] += Σ_{n<N} f(n, c)[k] for c < C, k < NOUT (NOUT 1 or 2; out1 only for NOUT 2; an
 * out may be NULL). f: a functor `__device__ void operator()(int64_t n, int64_t c, double *v)
 * const`. Uses ctx's workspace on `stream` (ctx already bound to it). */
template <int NOUT, class F>
static void colsum_launch(struct qc_kernels_cuda *ctx, float *out0, float *out1, int64_t N,
                          int64_t C, F f, cudaStream_t stream)
{
    static_assert(NOUT == 1 || NOUT == 2, "colsum: 1 or 2 outputs");
    if (N <= 0 || C <= 0 || (!out0 && !out1))
        return;
    struct qc_colsum_plan plan;
    QC_ASSERT(qc_colsum_plan_make(N, C, NOUT, ctx->ws_bytes, &plan),
              "colsum: workspace of %zu bytes too small", ctx->ws_bytes);
    for (int64_t c0 = 0; c0 < C; c0 += plan.slab) {
        int64_t cs = C - c0 < plan.slab ? C - c0 : plan.slab;
        const struct qc_colsum_grid g = qc_colsum_grid_of(&plan, cs);
        dim3 grid(g.partial_x, g.partial_y);
        dim3 block(COLSUM_TX, COLSUM_TY);
        colsum_partial_kernel<NOUT, F>
            <<<grid, block, 0, stream>>>(ctx->ws, N, c0, cs, plan.rows_per_chunk, plan.nchunk, f);
        QC_CUDA_LAUNCH_CHECK();
        colsum_final_kernel<NOUT>
            <<<g.final_blocks, CUDA_BLOCK, 0, stream>>>(out0, out1, ctx->ws, c0, cs, plan.nchunk);
        QC_CUDA_LAUNCH_CHECK();
    }
}

#endif /* QC_KERNELS_CUDA_COMMON_CUH */
