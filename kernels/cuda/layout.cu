/*
 * layout.cu — cumsum, strided 2-D copies, repeat_interleave, tile, transpose01 and the
 * embedding lookup (kernels/cpu/layout.c, embedding.c). Every sum runs in the CPU's order and
 * precision (scans in ascending / descending l with a double accumulator, repeats in ascending
 * r, lookups in ascending n, fp32), so the results are bit-identical to the CPU's.
 */
#include "cuda_common.cuh"

// ---- cumsum
// --------------------------------------------------------------------------------------

/* One thread per (o, i) column, walking l up (forward) or down (backward). */
static __global__ void cumsum_kernel(float *out, const float *inp, int64_t outer, int64_t L,
                                     int64_t inner, bool reverse)
{
    int64_t cols = outer * inner;
    for (int64_t t = cuda_tid(); t < cols; t += cuda_nthreads()) {
        int64_t o = t / inner, i = t % inner;
        double acc = 0.0;
        for (int64_t j = 0; j < L; j++) {
            int64_t l = reverse ? L - 1 - j : j;
            int64_t k = (o * L + l) * inner + i;
            acc += (double)inp[k];
            out[k] = (float)acc;
        }
    }
}

void qc_cumsum_forward_cuda(float *out, const float *inp, int64_t outer, int64_t L, int64_t inner,
                            cudaStream_t stream)
{
    QC_ASSERT(outer >= 0 && L >= 0 && inner >= 0, "cumsum fwd cuda: bad dims");
    if (outer * inner == 0 || L == 0)
        return;
    cumsum_kernel<<<cuda_blocks(outer * inner, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        out, inp, outer, L, inner, false);
    QC_CUDA_LAUNCH_CHECK();
}

void qc_cumsum_backward_cuda(float *dinp, const float *dout, int64_t outer, int64_t L,
                             int64_t inner, cudaStream_t stream)
{
    QC_ASSERT(outer >= 0 && L >= 0 && inner >= 0, "cumsum bwd cuda: bad dims");
    if (outer * inner == 0 || L == 0)
        return;
    cumsum_kernel<<<cuda_blocks(outer * inner, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        dinp, dout, outer, L, inner, true);
    QC_CUDA_LAUNCH_CHECK();
}

// ---- copy2d
// ----------------------------------------------------------------------------------------

static __global__ void copy2d_kernel(float *dst, int64_t ld_dst, const float *src, int64_t ld_src,
                                     int64_t rows, int64_t cols, bool accum)
{
    int64_t total = rows * cols;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t r = t / cols, c = t % cols;
        float v = src[r * ld_src + c];
        float *d = dst + r * ld_dst + c;
        *d = accum ? *d + v : v;
    }
}

void qc_copy2d_cuda(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows,
                    int64_t cols, bool accum, cudaStream_t stream)
{
    QC_ASSERT(rows >= 0 && cols >= 0 && ld_dst >= cols && ld_src >= cols,
              "copy2d cuda: rows %lld cols %lld ld %lld/%lld", (long long)rows, (long long)cols,
              (long long)ld_dst, (long long)ld_src);
    if (rows * cols == 0)
        return;
    if (!accum) {
        QC_CUDA_ASSERT(cudaMemcpy2DAsync(
            dst, (size_t)ld_dst * sizeof(float), src, (size_t)ld_src * sizeof(float),
            (size_t)cols * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice, stream));
        return;
    }
    copy2d_kernel<<<cuda_blocks(rows * cols, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        dst, ld_dst, src, ld_src, rows, cols, accum);
    QC_CUDA_LAUNCH_CHECK();
}

// ---- repeat_interleave / tile
// ----------------------------------------------------------------------

static __global__ void repeat_interleave_forward_kernel(float *out, const float *inp, int64_t N,
                                                        int64_t R, int64_t C)
{
    int64_t total = N * R * C;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t row = t / C, c = t % C; /* row = n*R + r */
        out[t] = inp[(row / R) * C + c];
    }
}

void qc_repeat_interleave_forward_cuda(float *out, const float *inp, int64_t N, int64_t R,
                                       int64_t C, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && R >= 0 && C >= 0, "repeat_interleave fwd cuda: bad dims");
    if (N * R * C == 0)
        return;
    repeat_interleave_forward_kernel<<<cuda_blocks(N * R * C, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        out, inp, N, R, C);
    QC_CUDA_LAUNCH_CHECK();
}

/* dinp[n, c] (=|+=) Σ_r dout[(n*R + r)*C + c]  (row_stride = R*C, rep_stride = C), or for tile
 * dinp[k] (=|+=) Σ_r dout[r*N*C + k]  (row_stride = C, rep_stride = N*C). */
static __global__ void repeat_sum_kernel(float *dinp, const float *dout, int64_t N, int64_t R,
                                         int64_t C, int64_t row_stride, int64_t rep_stride,
                                         bool accum)
{
    int64_t total = N * C;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t n = t / C, c = t % C;
        const float *src = dout + n * row_stride + c;
        float acc = 0.0f;
        for (int64_t r = 0; r < R; r++)
            acc += src[r * rep_stride];
        dinp[t] = accum ? dinp[t] + acc : acc;
    }
}

void qc_repeat_interleave_backward_cuda(float *dinp, const float *dout, int64_t N, int64_t R,
                                        int64_t C, bool accum, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && R >= 0 && C >= 0, "repeat_interleave bwd cuda: bad dims");
    if (N * C == 0)
        return;
    repeat_sum_kernel<<<cuda_blocks(N * C, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        dinp, dout, N, R, C, R * C, C, accum);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void tile_forward_kernel(float *out, const float *inp, int64_t NC, int64_t R)
{
    int64_t total = NC * R;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads())
        out[t] = inp[t % NC];
}

void qc_tile_forward_cuda(float *out, const float *inp, int64_t N, int64_t R, int64_t C,
                          cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && R >= 0 && C >= 0, "tile fwd cuda: bad dims");
    if (N * R * C == 0)
        return;
    tile_forward_kernel<<<cuda_blocks(N * R * C, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, inp,
                                                                                       N * C, R);
    QC_CUDA_LAUNCH_CHECK();
}

void qc_tile_backward_cuda(float *dinp, const float *dout, int64_t N, int64_t R, int64_t C,
                           bool accum, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && R >= 0 && C >= 0, "tile bwd cuda: bad dims");
    if (N * C == 0)
        return;
    /* the flat index k = n*C + c walks dout[r*N*C + k]: treat (N*C) as N' rows of C' = 1 */
    repeat_sum_kernel<<<cuda_blocks(N * C, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        dinp, dout, N * C, R, 1, 1, N * C, accum);
    QC_CUDA_LAUNCH_CHECK();
}

// ---- transpose01
// -----------------------------------------------------------------------------------

static __global__ void transpose01_kernel(float *out, const float *inp, int64_t D0, int64_t D1,
                                          int64_t C)
{
    int64_t total = D0 * D1 * C;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t c = t % C, ab = t / C; /* t indexes out (D1, D0, C): ab = b*D0 + a */
        int64_t b = ab / D0, a = ab % D0;
        out[t] = inp[(a * D1 + b) * C + c];
    }
}

void qc_transpose01_forward_cuda(float *out, const float *inp, int64_t D0, int64_t D1, int64_t C,
                                 cudaStream_t stream)
{
    QC_ASSERT(D0 >= 0 && D1 >= 0 && C >= 0 && (out != inp || D0 * D1 * C == 0),
              "transpose01 cuda: bad dims or aliasing");
    if (D0 * D1 * C == 0)
        return;
    transpose01_kernel<<<cuda_blocks(D0 * D1 * C, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, inp,
                                                                                        D0, D1, C);
    QC_CUDA_LAUNCH_CHECK();
}

void qc_transpose01_backward_cuda(float *dinp, const float *dout, int64_t D0, int64_t D1, int64_t C,
                                  cudaStream_t stream)
{
    qc_transpose01_forward_cuda(dinp, dout, D1, D0, C, stream);
}

// ---- embedding
// -------------------------------------------------------------------------------------

static __global__ void embedding_forward_kernel(float *out, const int64_t *idx, const float *table,
                                                int64_t N, int64_t C)
{
    int64_t total = N * C;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t n = t / C, c = t % C;
        out[t] = table[idx[n] * C + c];
    }
}

void qc_embedding_forward_cuda(float *out, const int64_t *idx, const float *table, int64_t N,
                               int64_t C, int64_t V, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && C > 0 && V > 0, "embedding fwd cuda: N %lld C %lld V %lld", (long long)N,
              (long long)C, (long long)V);
    if (N == 0)
        return;
    embedding_forward_kernel<<<cuda_blocks(N * C, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        out, idx, table, N, C);
    QC_CUDA_LAUNCH_CHECK();
}

/* dtable[v, c] += dout[n, c] over the rows n with idx[n] == v, n ascending in fp32: the CPU's
 * order, so the bits equal the CPU's. One warp per (v, 32 columns) walks the rows in chunks of
 * EMB_CHUNKS x 32: the lanes load the chunks' indices at once, a ballot per chunk marks the rows
 * of category v, their values are loaded together (independent loads in flight), then added in
 * ascending n. Work: V·N/32 index loads and N·C adds, against V·C·N compares for one thread per
 * (v, c) walking every row (that kernel, run once per fused tile, was the bottleneck a static
 * review flagged; the gain is not measured yet: no GPU run). */
#define EMB_WARPS  4 /* warps per block */
#define EMB_CHUNKS 4 /* 32-row chunks whose indices are loaded together */

static __global__ void embedding_backward_kernel(float *dtable, const float *dout,
                                                 const int64_t *idx, int64_t N, int64_t C,
                                                 int64_t V)
{
    const int lane = threadIdx.x & 31;
    const int64_t groups = (C + 31) / 32, nwarp = V * groups;
    /* w is the same for all lanes of a warp: the ballots below see the whole warp */
    for (int64_t w = (int64_t)blockIdx.x * EMB_WARPS + (threadIdx.x >> 5); w < nwarp;
         w += (int64_t)gridDim.x * EMB_WARPS) {
        const int64_t v = w / groups, c = (w % groups) * 32 + lane;
        const bool col = c < C;
        float acc = col ? dtable[v * C + c] : 0.0f;
        for (int64_t n0 = 0; n0 < N; n0 += 32 * EMB_CHUNKS) {
            int64_t id[EMB_CHUNKS];
#pragma unroll
            for (int k = 0; k < EMB_CHUNKS; k++) {
                const int64_t n = n0 + 32 * k + lane;
                id[k] = n < N ? idx[n] : -1;
            }
#pragma unroll
            for (int k = 0; k < EMB_CHUNKS; k++) {
                const unsigned int mask = __ballot_sync(0xffffffffu, id[k] == v);
                if (!mask)
                    continue;
                const int64_t nk = n0 + 32 * k;
                float val[32];
#pragma unroll
                for (int b = 0; b < 32; b++)
                    val[b] = col && ((mask >> b) & 1u) ? dout[(nk + b) * C + c] : 0.0f;
#pragma unroll
                for (int b = 0; b < 32; b++)
                    if ((mask >> b) & 1u)
                        acc = __fadd_rn(acc, val[b]);
            }
        }
        if (col)
            dtable[v * C + c] = acc;
    }
}

void qc_embedding_backward_cuda(float *dtable, const float *dout, const int64_t *idx, int64_t N,
                                int64_t C, int64_t V, cudaStream_t stream)
{
    QC_ASSERT(N >= 0 && C > 0 && V > 0, "embedding bwd cuda: N %lld C %lld V %lld", (long long)N,
              (long long)C, (long long)V);
    if (N == 0)
        return;
    const int64_t warps = V * ((C + 31) / 32);
    embedding_backward_kernel<<<cuda_blocks(warps, EMB_WARPS), EMB_WARPS * 32, 0, stream>>>(
        dtable, dout, idx, N, C, V);
    QC_CUDA_LAUNCH_CHECK();
}
