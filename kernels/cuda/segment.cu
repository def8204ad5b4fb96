/*
 * segment.cu — gather / scatter-add over a CSR and the graph-attention edge ops (score, segment
 * softmax, weighted aggregation with attention dropout), kernels/cpu/segment.c semantics.
 *
 * Determinism without atomics: every reduction over the edges of a destination runs inside one
 * warp (channels across lanes) or one thread (per head), walking the segment's items in CSR
 * order from 0 in fp32 — the CPU's order, so sums match it up to FMA contraction. Per-edge
 * outputs (no reduction) are one thread per element.
 */
#include "cuda_common.cuh"

#define SEG_WARPS 8 /* segments (warps) per block */

/* Warp-per-segment launch shape: blocks of SEG_WARPS warps, grid-stride over segments. */
static inline unsigned int seg_blocks(int64_t nseg)
{
    return cuda_blocks(nseg, SEG_WARPS);
}
#define SEG_THREADS (SEG_WARPS * 32)

/* Index of this warp's first segment, the warp stride, and the lane. */
#define SEG_WARP_LOOP(s, nseg)                                                                     \
    for (int64_t s = (int64_t)blockIdx.x * SEG_WARPS + (threadIdx.x >> 5); s < (nseg);             \
         s += (int64_t)gridDim.x * SEG_WARPS)

// ---- gather / scatter-add
// ------------------------------------------------------------------------

static __global__ void gather_rows_kernel(float *out, const float *inp, const int64_t *idx,
                                          int64_t E, int64_t C, bool accum)
{
    int64_t total = E * C;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t e = t / C, c = t % C;
        float v = inp[idx[e] * C + c];
        out[t] = accum ? out[t] + v : v;
    }
}

void qc_gather_rows_forward_cuda(float *out, const float *inp, const int64_t *idx, int64_t E,
                                 int64_t C, bool accum, cudaStream_t stream)
{
    QC_ASSERT(E >= 0 && C >= 0, "gather fwd cuda: E %lld C %lld", (long long)E, (long long)C);
    if (E * C == 0)
        return;
    gather_rows_kernel<<<cuda_blocks(E * C, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(out, inp, idx, E,
                                                                                  C, accum);
    QC_CUDA_LAUNCH_CHECK();
}

/* out[s] (=|+=) Σ_{k in segment s, CSR order} inp[item(k)], one warp per segment. */
static __global__ void segment_sum_kernel(float *out, const float *inp, const int64_t *ptr,
                                          const int64_t *perm, int64_t nseg, int64_t C, bool accum)
{
    int lane = threadIdx.x & 31;
    SEG_WARP_LOOP(s, nseg)
    {
        int64_t k0 = ptr[s], k1 = ptr[s + 1];
        float *o = out + s * C;
        for (int64_t c0 = 0; c0 < C; c0 += 32) {
            int64_t c = c0 + lane;
            if (c >= C)
                break;
            float acc = accum ? o[c] : 0.0f;
            for (int64_t k = k0; k < k1; k++)
                acc += inp[csr_item(perm, k) * C + c];
            o[c] = acc;
        }
    }
}

static void segment_sum(float *out, const float *inp, const struct qc_csr *csr, int64_t C,
                        bool accum, cudaStream_t stream)
{
    if (csr->nseg == 0 || C == 0)
        return;
    segment_sum_kernel<<<seg_blocks(csr->nseg), SEG_THREADS, 0, stream>>>(
        out, inp, csr->ptr, csr->perm, csr->nseg, C, accum);
    QC_CUDA_LAUNCH_CHECK();
}

void qc_gather_rows_backward_cuda(float *dinp, const float *dout, struct qc_csr csr, int64_t C,
                                  bool accum, cudaStream_t stream)
{
    cuda_csr_check(&csr, "gather bwd cuda");
    segment_sum(dinp, dout, &csr, C, accum, stream);
}

void qc_scatter_add_forward_cuda(float *out, const float *inp, struct qc_csr csr, int64_t C,
                                 bool accum, cudaStream_t stream)
{
    cuda_csr_check(&csr, "scatter_add fwd cuda");
    segment_sum(out, inp, &csr, C, accum, stream);
}

void qc_scatter_add_backward_cuda(float *dinp, const float *dout, struct qc_csr csr, int64_t C,
                                  bool accum, cudaStream_t stream)
{
    cuda_csr_check(&csr, "scatter_add bwd cuda");
    QC_ASSERT(csr.seg || csr.nitem == 0, "scatter_add bwd cuda: csr.seg is NULL");
    qc_gather_rows_forward_cuda(dinp, dout, csr.seg, csr.nitem, C, accum, stream);
}

// ---- attention score
// -------------------------------------------------------------------------------

/* score[e,h] = (Σ_c q[seg[e],h,c]·k[e,h,c]) · scale, one thread per (e, h), c ascending. */
static __global__ void attn_score_forward_kernel(float *score, const float *q, const float *k,
                                                 const int64_t *seg, int64_t E, int64_t H,
                                                 int64_t Dh, float scale)
{
    int64_t D = H * Dh, total = E * H;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t e = t / H, h = t % H;
        const float *qi = q + seg[e] * D + h * Dh;
        const float *ke = k + e * D + h * Dh;
        float acc = 0.0f;
        for (int64_t c = 0; c < Dh; c++)
            acc += qi[c] * ke[c];
        score[t] = acc * scale;
    }
}

void qc_attn_score_forward_cuda(float *score, const float *q, const float *k, struct qc_csr csr,
                                int64_t H, int64_t Dh, float scale, cudaStream_t stream)
{
    cuda_csr_check(&csr, "attn_score fwd cuda");
    QC_ASSERT(H > 0 && Dh > 0 && (csr.seg || csr.nitem == 0), "attn_score fwd cuda: H %lld Dh %lld",
              (long long)H, (long long)Dh);
    if (csr.nitem == 0)
        return;
    attn_score_forward_kernel<<<cuda_blocks(csr.nitem * H, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(
        score, q, k, csr.seg, csr.nitem, H, Dh, scale);
    QC_CUDA_LAUNCH_CHECK();
}

/* dk[e,h,c] = (dscore[e,h]·scale)·q[seg[e],h,c] */
static __global__ void attn_score_dk_kernel(float *dk, const float *dscore, const float *q,
                                            const int64_t *seg, int64_t E, int64_t H, int64_t Dh,
                                            float scale)
{
    int64_t D = H * Dh, total = E * D;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t e = t / D, ch = t % D;
        float g = dscore[e * H + ch / Dh] * scale;
        dk[t] = g * q[seg[e] * D + ch];
    }
}

/* dq[s,h,c] (=|+=) Σ_{e in s, CSR order} (dscore[e,h]·scale)·k[e,h,c]; one warp per segment. */
static __global__ void attn_score_dq_kernel(float *dq, const float *dscore, const float *k,
                                            const int64_t *ptr, const int64_t *perm, int64_t nseg,
                                            int64_t H, int64_t Dh, float scale, bool accum)
{
    int lane = threadIdx.x & 31;
    int64_t D = H * Dh;
    SEG_WARP_LOOP(s, nseg)
    {
        int64_t k0 = ptr[s], k1 = ptr[s + 1];
        float *o = dq + s * D;
        for (int64_t c0 = 0; c0 < D; c0 += 32) {
            int64_t ch = c0 + lane;
            if (ch >= D)
                break;
            int64_t h = ch / Dh;
            float acc = accum ? o[ch] : 0.0f;
            for (int64_t kk = k0; kk < k1; kk++) {
                int64_t e = csr_item(perm, kk);
                float g = dscore[e * H + h] * scale;
                acc += g * k[e * D + ch];
            }
            o[ch] = acc;
        }
    }
}

void qc_attn_score_backward_cuda(float *dq, float *dk, const float *dscore, const float *q,
                                 const float *k, struct qc_csr csr, int64_t H, int64_t Dh,
                                 float scale, bool accum, cudaStream_t stream)
{
    cuda_csr_check(&csr, "attn_score bwd cuda");
    QC_ASSERT(H > 0 && Dh > 0, "attn_score bwd cuda: H %lld Dh %lld", (long long)H, (long long)Dh);
    if (dk && csr.nitem > 0) {
        QC_ASSERT(csr.seg, "attn_score bwd cuda: csr.seg is NULL");
        attn_score_dk_kernel<<<cuda_blocks(csr.nitem * H * Dh, CUDA_BLOCK), CUDA_BLOCK, 0,
                               stream>>>(dk, dscore, q, csr.seg, csr.nitem, H, Dh, scale);
        QC_CUDA_LAUNCH_CHECK();
    }
    if (dq && csr.nseg > 0) {
        attn_score_dq_kernel<<<seg_blocks(csr.nseg), SEG_THREADS, 0, stream>>>(
            dq, dscore, k, csr.ptr, csr.perm, csr.nseg, H, Dh, scale, accum);
        QC_CUDA_LAUNCH_CHECK();
    }
}

// ---- segment softmax
// --------------------------------------------------------------------------------

/* One thread per (segment, head): max, Σ exp in CSR order, normalise. */
static __global__ void segment_softmax_forward_kernel(float *out, float *seg_max, float *seg_sum,
                                                      const float *score, const int64_t *ptr,
                                                      const int64_t *perm, int64_t nseg, int64_t H)
{
    int64_t total = nseg * H;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t s = t / H, h = t % H;
        int64_t k0 = ptr[s], k1 = ptr[s + 1];
        float mx = 0.0f; /* empty segment: PyG's scatter-max fill value */
        if (k1 > k0) {
            mx = -INFINITY;
            for (int64_t k = k0; k < k1; k++) {
                float v = score[csr_item(perm, k) * H + h];
                mx = v > mx ? v : mx;
            }
        }
        float sum = 0.0f;
        for (int64_t k = k0; k < k1; k++) {
            int64_t i = csr_item(perm, k) * H + h;
            float ex = expf(score[i] - mx);
            out[i] = ex; /* out may alias score: score[i] is not read again */
            sum += ex;
        }
        sum += QC_SOFTMAX_EPS;
        for (int64_t k = k0; k < k1; k++) {
            int64_t i = csr_item(perm, k) * H + h;
            out[i] = out[i] / sum;
        }
        if (seg_max)
            seg_max[t] = mx;
        if (seg_sum)
            seg_sum[t] = sum;
    }
}

void qc_segment_softmax_forward_cuda(float *out, float *seg_max, float *seg_sum, const float *score,
                                     struct qc_csr csr, int64_t H, cudaStream_t stream)
{
    cuda_csr_check(&csr, "segment_softmax fwd cuda");
    QC_ASSERT(H > 0, "segment_softmax fwd cuda: H %lld", (long long)H);
    if (csr.nseg == 0)
        return;
    segment_softmax_forward_kernel<<<cuda_blocks(csr.nseg * H, CUDA_BLOCK), CUDA_BLOCK, 0,
                                     stream>>>(out, seg_max, seg_sum, score, csr.ptr, csr.perm,
                                               csr.nseg, H);
    QC_CUDA_LAUNCH_CHECK();
}

static __global__ void segment_softmax_backward_kernel(float *dscore, const float *dout,
                                                       const float *out, const int64_t *ptr,
                                                       const int64_t *perm, int64_t nseg, int64_t H)
{
    int64_t total = nseg * H;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t s = t / H, h = t % H;
        int64_t k0 = ptr[s], k1 = ptr[s + 1];
        float dot = 0.0f;
        for (int64_t k = k0; k < k1; k++) {
            int64_t i = csr_item(perm, k) * H + h;
            dot += out[i] * dout[i];
        }
        for (int64_t k = k0; k < k1; k++) {
            int64_t i = csr_item(perm, k) * H + h;
            dscore[i] = out[i] * (dout[i] - dot); /* may alias dout: read before written */
        }
    }
}

void qc_segment_softmax_backward_cuda(float *dscore, const float *dout, const float *out,
                                      struct qc_csr csr, int64_t H, cudaStream_t stream)
{
    cuda_csr_check(&csr, "segment_softmax bwd cuda");
    QC_ASSERT(H > 0, "segment_softmax bwd cuda: H %lld", (long long)H);
    if (csr.nseg == 0)
        return;
    segment_softmax_backward_kernel<<<cuda_blocks(csr.nseg * H, CUDA_BLOCK), CUDA_BLOCK, 0,
                                      stream>>>(dscore, dout, out, csr.ptr, csr.perm, csr.nseg, H);
    QC_CUDA_LAUNCH_CHECK();
}

// ---- weighted aggregation with attention dropout
// ---------------------------------------------------

/* Dropout parameters passed by value to the kernels (dropping == false: identity). */
struct drop_args {
    bool dropping;
    float scale;
    struct qc_dropout d; /* row_key (scene keying) is device memory */
};

static struct drop_args drop_args_make(const struct qc_dropout *d, const char *op)
{
    QC_ASSERT(!d || qc_dropout_valid(d), "%s: bad dropout", op);
    struct drop_args a = {};
    a.dropping = d && d->p != 0.0f;
    a.scale = 1.0f;
    if (a.dropping) {
        a.scale = 1.0f / (1.0f - d->p);
        a.d = *d;
    }
    return a;
}

/* The dropout multiplier of the call's element i (scale or 0). */
__device__ static inline float drop_factor(const struct drop_args &a, int64_t i)
{
    const struct qc_dropout &d = a.d;
    return cuda_drop_factor(d.seed, d.step, d.block, qc_dropout_index(&d, d.index_base + i), d.p,
                            a.scale);
}

/* α' of element (e, h): α·(scale or 0) with dropout, α without. */
__device__ static inline float dropped_alpha(const struct drop_args &d, const float *alpha,
                                             int64_t i)
{
    float a = alpha[i];
    if (d.dropping)
        a = a * drop_factor(d, i);
    return a;
}

/* out[s, ch] = Σ_{e in s, CSR order} α'[e,h]·v[e,ch]; one warp per segment. For H <= 32 the
 * H values α'[e, 0..H) are drawn once per edge by lanes 0..H-1 and shuffled to the channels. */
static __global__ void attn_aggregate_forward_kernel(float *out, const float *alpha, const float *v,
                                                     const int64_t *ptr, const int64_t *perm,
                                                     int64_t nseg, int64_t H, int64_t Dh,
                                                     struct drop_args d)
{
    int lane = threadIdx.x & 31;
    int64_t D = H * Dh;
    bool shuffle = H <= 32 && D <= 32 * 8;
    SEG_WARP_LOOP(s, nseg)
    {
        int64_t k0 = ptr[s], k1 = ptr[s + 1];
        float *o = out + s * D;
        if (shuffle) {
            /* this lane's channels: lane, lane+32, ... (at most 8 of them) */
            float acc[8];
            for (int j = 0; j < 8; j++)
                acc[j] = 0.0f;
            for (int64_t kk = k0; kk < k1; kk++) {
                int64_t e = csr_item(perm, kk);
                float ah = lane < H ? dropped_alpha(d, alpha, e * H + lane) : 0.0f;
                for (int j = 0; j < 8; j++) {
                    int64_t ch = lane + 32 * j;
                    float a = __shfl_sync(0xffffffffu, ah, (int)((ch < D ? ch : 0) / Dh));
                    if (ch < D)
                        acc[j] += v[e * D + ch] * a;
                }
            }
            for (int j = 0; j < 8; j++) {
                int64_t ch = lane + 32 * j;
                if (ch < D)
                    o[ch] = acc[j];
            }
        } else {
            for (int64_t c0 = 0; c0 < D; c0 += 32) {
                int64_t ch = c0 + lane;
                if (ch >= D)
                    break;
                int64_t h = ch / Dh;
                float acc = 0.0f;
                for (int64_t kk = k0; kk < k1; kk++) {
                    int64_t e = csr_item(perm, kk);
                    acc += v[e * D + ch] * dropped_alpha(d, alpha, e * H + h);
                }
                o[ch] = acc;
            }
        }
    }
}

void qc_attn_aggregate_forward_cuda(float *out, const float *alpha, const float *v,
                                    struct qc_csr csr, int64_t H, int64_t Dh,
                                    const struct qc_dropout *drop, cudaStream_t stream)
{
    cuda_csr_check(&csr, "attn_aggregate fwd cuda");
    QC_ASSERT(H > 0 && Dh > 0, "attn_aggregate fwd cuda: H %lld Dh %lld", (long long)H,
              (long long)Dh);
    struct drop_args d = drop_args_make(drop, "attn_aggregate fwd cuda");
    if (csr.nseg == 0)
        return;
    attn_aggregate_forward_kernel<<<seg_blocks(csr.nseg), SEG_THREADS, 0, stream>>>(
        out, alpha, v, csr.ptr, csr.perm, csr.nseg, H, Dh, d);
    QC_CUDA_LAUNCH_CHECK();
}

/* One thread per (e, h): dalpha = f·Σ_c dout[seg[e],h,c]·v[e,h,c]; dv[e,h,:] = α'·dout[seg[e],h,:].
 */
static __global__ void attn_aggregate_backward_kernel(float *dalpha, float *dv, const float *dout,
                                                      const float *alpha, const float *v,
                                                      const int64_t *seg, int64_t E, int64_t H,
                                                      int64_t Dh, struct drop_args d)
{
    int64_t D = H * Dh, total = E * H;
    for (int64_t t = cuda_tid(); t < total; t += cuda_nthreads()) {
        int64_t e = t / H, h = t % H;
        const float *g = dout + seg[e] * D + h * Dh;
        float f = d.dropping ? drop_factor(d, t) : 1.0f;
        if (dalpha) {
            const float *ve = v + e * D + h * Dh;
            float acc = 0.0f;
            for (int64_t c = 0; c < Dh; c++)
                acc += g[c] * ve[c];
            dalpha[t] = d.dropping ? acc * f : acc;
        }
        if (dv) {
            float a = d.dropping ? alpha[t] * f : alpha[t];
            float *o = dv + e * D + h * Dh;
            for (int64_t c = 0; c < Dh; c++)
                o[c] = g[c] * a;
        }
    }
}

void qc_attn_aggregate_backward_cuda(float *dalpha, float *dv, const float *dout,
                                     const float *alpha, const float *v, struct qc_csr csr,
                                     int64_t H, int64_t Dh, const struct qc_dropout *drop,
                                     cudaStream_t stream)
{
    cuda_csr_check(&csr, "attn_aggregate bwd cuda");
    QC_ASSERT(H > 0 && Dh > 0 && (csr.seg || csr.nitem == 0),
              "attn_aggregate bwd cuda: H %lld Dh %lld", (long long)H, (long long)Dh);
    struct drop_args d = drop_args_make(drop, "attn_aggregate bwd cuda");
    if (csr.nitem == 0 || (!dalpha && !dv))
        return;
    attn_aggregate_backward_kernel<<<cuda_blocks(csr.nitem * H, CUDA_BLOCK), CUDA_BLOCK, 0,
                                     stream>>>(dalpha, dv, dout, alpha, v, csr.seg, csr.nitem, H,
                                               Dh, d);
    QC_CUDA_LAUNCH_CHECK();
}
