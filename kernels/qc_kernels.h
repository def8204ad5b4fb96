/*
 * qc_kernels.h — the op interface: every CPU reference op of QCNet (qc_kernels_cuda.h declares
 * the CUDA launcher of each).
 *
 * Naming: qc_<op>_<pass>_cpu(...). The CUDA backend adds qc_<op>_<pass>_cuda(..., cudaStream_t)
 * with IDENTICAL arguments plus the trailing stream. So no op allocates: whatever temporary
 * memory an op needs is passed in as `scratch`, sized by a qc_<op>_*_scratch_numel() function
 * declared here (the same size for both backends).
 *
 * Conventions (STYLE.md §5):
 * - fp32 tensors, row-major, contiguous unless a leading dimension `ld*` (in elements) is given.
 *   Shapes are written as (N,C) next to each pointer. Sizes and indices are int64_t.
 * - Argument order: forward takes outputs, saved-for-backward, inputs, params, dims, scratch;
 *   backward takes dinp, dweight, dbias, dout, saved/inputs, dims, scratch.
 * - Every output is OVERWRITE (=) or ACCUM (+=). Parameter gradients always ACCUM. Activation
 *   gradients OVERWRITE, except where a `bool accum` argument lets the caller choose (false =
 *   OVERWRITE, true = ACCUM): that serves inputs with several consumers (residuals, shared x̂_s).
 * - A pointer documented "may be NULL" skips that output/input. Elementwise ops may run in place
 *   (out == inp) where noted.
 * - Reductions are deterministic: every sum has a fixed order that does not depend on the number
 *   of threads (column reductions loop rows in ascending order; segment sums follow the CSR
 *   order). No atomics. Two runs, and store vs recompute, give the same bits.
 * - Preconditions (shapes, NULLs) are programmer errors and abort via QC_ASSERT. Indices are
 *   trusted (validated by the loader); QC_DEBUG >= 1 checks them.
 * - Ops are pure functions of their arguments: thread-safe across calls on distinct outputs. The
 *   CPU ops use OpenMP internally; call them from one thread per output.
 *
 * Glossary:
 *   CSR    a grouping of items (edges) into segments (destination nodes), struct qc_csr below.
 *   site   one dropout application in a step, identified by a 32-bit `block` id (qc_philox.h).
 */
#ifndef QC_KERNELS_QC_KERNELS_H
#define QC_KERNELS_QC_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "qc_philox.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- constants (QCNET.md §0, §3) -------------------------------------------------------- */

#define QC_PI_F              3.14159274101257324f /* π rounded to fp32 */
#define QC_TWO_PI_F          6.28318548202514648f /* 2π rounded to fp32 */
#define QC_LAYERNORM_EPS     1e-5f                /* nn.LayerNorm default */
#define QC_SOFTMAX_EPS       1e-16f               /* PyG softmax: added to the segment sum */
#define QC_LAPLACE_SCALE_MIN 1e-6f                /* invisible clamp of the Laplace scale */
#define QC_KERNELS_MAX_MODES 64                   /* K bound for the per-agent loss ops */

/* The inline helpers below, and the formulas of activation_math.h, loss_math.h and gru_math.h,
 * compile for host and device under nvcc. */
#if defined(__CUDACC__)
#    define QC_KERNELS_HD static inline __host__ __device__
#else
#    define QC_KERNELS_HD static inline
#endif

/* fp32 a + b, a − b, a·b, a / b, each rounded once. On the device these are the __f*_rn
 * intrinsics, which nvcc never contracts into an FMA (it does fuse a plain a·b + c); on the
 * host the plain operators (the C code is ISO C11, compiled without contraction). A formula
 * shared by the CPU reference and the CUDA kernels writes with them the products whose
 * separate rounding the device must keep to give the CPU's bits. */
QC_KERNELS_HD float qc_fadd_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

QC_KERNELS_HD float qc_fsub_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

QC_KERNELS_HD float qc_fmul_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

QC_KERNELS_HD float qc_fdiv_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/* ---- shared argument types -------------------------------------------------------------- */

/* Items (edges) grouped by segment (destination). Segment s owns the items
 * perm[ptr[s]] .. perm[ptr[s+1]-1], in that order (ascending item id within a segment when built
 * by qc_csr_build_cpu, which is what makes every segment reduction deterministic).
 * Invariants: ptr[0] = 0, ptr[nseg] = nitem, ptr non-decreasing; seg[perm[k]] = s for
 * ptr[s] <= k < ptr[s+1]. perm == NULL means the identity (items already sorted by segment).
 * A struct of device pointers, passed by value (the same on both backends). */
struct qc_csr {
    const int64_t *ptr;  /* (nseg+1) segment offsets into the perm order */
    const int64_t *perm; /* (nitem) item ids grouped by segment, or NULL = identity */
    const int64_t *seg;  /* (nitem) segment of each item: the edge's destination index */
    int64_t nseg;        /* number of segments (destination nodes) */
    int64_t nitem;       /* number of items (edges) */
};

/* Dropout of one site (qc_philox.h gives the exact mapping). p == 0 means off (identity).
 * Element i of the call is the site's flat element g = index_base + i, so a tile of a larger
 * tensor passes the flat index of its first element. Scale of a kept element: 1.0f / (1.0f - p).
 * Without row_key, g is the Philox index. With row_key, the site is a (reps, rows, row_len)
 * tensor whose rows each belong to one scene (the attention weights α (Q·E, H): reps Q, rows E,
 * row_len H; the FFN hidden (Nd, FF): reps 1, rows Nd, row_len FF), and element (q, r, c) has
 * the scene-keyed index (qc_philox.h) s_r·2^34 + (l_r·reps + q)·row_len + c, where row_key[r] =
 * s_r·2^34 + l_r holds r's scene s_r and its rank l_r among the rows of that scene (in row
 * order): the mask of a scene does not depend on the rows of other scenes around it
 * (qc_dropout_index). */
struct qc_dropout {
    float p;                /* drop probability, 0 <= p < 1 */
    uint64_t seed;          /* run seed */
    uint32_t step;          /* optimizer step */
    uint32_t block;         /* dropout site id, unique within a step (assigned by the model) */
    int64_t index_base;     /* flat index of this call's element 0 within the site */
    const int64_t *row_key; /* (rows) keys, memory of the op's backend; NULL: flat indices */
    int64_t rows;           /* with row_key: rows the keys cover, >= 1 */
    int64_t reps;           /* with row_key: repetitions q sharing each row's key, >= 1 */
    int64_t row_len;        /* with row_key: elements per row, >= 1; rows·reps·row_len <= 2^34 */
};

/* The Philox index of element (q, r, c) of a scene-keyed site (struct qc_dropout above). */
QC_KERNELS_HD int64_t qc_dropout_keyed_index(const int64_t *row_key, int64_t reps, int64_t row_len,
                                             int64_t r, int64_t q, int64_t c)
{
    const int64_t key = row_key[r];
    const int64_t l = key & (QC_DROPOUT_LOCAL_MAX - 1);
    return (key - l) + (l * reps + q) * row_len + c;
}

/* The Philox index of the site's flat element g (= index_base + i): g itself without row_key. */
QC_KERNELS_HD int64_t qc_dropout_index(const struct qc_dropout *d, int64_t g)
{
    if (!d->row_key)
        return g;
    const int64_t row = g / d->row_len;
    return qc_dropout_keyed_index(d->row_key, d->reps, d->row_len, row % d->rows, row / d->rows,
                                  g % d->row_len);
}

/* A launcher's check of d's fields (host): p in [0, 1), index_base >= 0, and with row_key
 * positive sizes whose product fits a scene's 2^34 indices. */
static inline bool qc_dropout_valid(const struct qc_dropout *d)
{
    if (!(d->p >= 0.0f && d->p < 1.0f && d->index_base >= 0))
        return false;
    if (!d->row_key)
        return true;
    return d->rows >= 1 && d->reps >= 1 && d->row_len >= 1 &&
           d->rows <= QC_DROPOUT_LOCAL_MAX / d->reps / d->row_len;
}

/* AdamW hyper-parameters of one step (PyTorch 2.0 semantics; QCNET.md §1). */
struct qc_adamw_hparams {
    double lr;           /* learning rate of this step */
    double beta1, beta2; /* 0.9, 0.999 */
    double eps;          /* 1e-8 */
    double weight_decay; /* decoupled; the decay group's wd (1e-4) */
    int64_t step;        /* 1-based step count n used in the bias corrections */
};

/* ---- CPU backend: BLAS threading -------------------------------------------------------- */

/* The thread count of the BLAS library behind the CPU GEMMs (OpenBLAS), and setting it (n >= 1).
 * Code that runs GEMMs from inside its own parallel region (the fused attention tiles) sets 1
 * around that region, so BLAS does not start threads of its own, then restores the old value. */
int qc_kernels_cpu_blas_threads(void);
void qc_kernels_cpu_set_blas_threads(int n);

/* The host ops' threads: OpenMP's and OpenBLAS's count both set to n (train.cpu_threads);
 * n = 0 restores the counts the process had at its first call (OMP_NUM_THREADS and
 * OPENBLAS_NUM_THREADS, else every core). Results are bit-reproducible for a given count; the
 * tiled FE and fused attention backwards sum one gradient lane per thread (cpu/cpu_internal.h),
 * so another count changes the last bits of those gradients. Call it outside parallel regions. */
void qc_kernels_cpu_set_threads(int n);

/* ---- geometry helpers (QCNET.md §3.0): forward only, exact fp32 order -------------------- */

/* wrap_angle(a) = -π_f + rem(a + π_f, 2π_f), rem = PyTorch remainder (sign of the divisor).
 * Result in [-π_f, π_f); wrap(π) = -π_f. Usable by the loader (host) as well. */
QC_KERNELS_HD float qc_wrap_anglef(float a)
{
    float x = a + QC_PI_F;
    float m = fmodf(x, QC_TWO_PI_F);
    if (m != 0.0f && m < 0.0f) /* fmod took the dividend's sign; the divisor is positive */
        m = m + QC_TWO_PI_F;
    return -QC_PI_F + m;
}

/* angle_between_2d_vectors(c, n) = atan2(c0*n1 - c1*n0, (0 + c0*n0) + c1*n1): every product
 * rounded on its own (no FMA, on the device too: qc_fmul_rn), dot accumulated from +0 so
 * n = (0,0) gives ±0, never ±π. */
QC_KERNELS_HD float qc_angle_between_2df(float c0, float c1, float n0, float n1)
{
    float p0 = qc_fmul_rn(c0, n1);
    float p1 = qc_fmul_rn(c1, n0);
    float cross = qc_fsub_rn(p0, p1);
    float d0 = qc_fmul_rn(c0, n0);
    float d1 = qc_fmul_rn(c1, n1);
    float dot = qc_fadd_rn(0.0f, d0);
    dot = qc_fadd_rn(dot, d1);
    return atan2f(cross, dot);
}

/* out[i] = wrap_angle(inp[i]). OVERWRITE, in place allowed. */
void qc_wrap_angle_forward_cpu(float *out /* (n) */, const float *inp /* (n) */, int64_t n);
/* out[i] = angle_between_2d_vectors(ctr[i], vec[i]). OVERWRITE. */
void qc_angle_between_2d_forward_cpu(float *out /* (N) */, const float *ctr /* (N,2) */,
                                     const float *vec /* (N,2) */, int64_t N);

/* ---- linear: out = inp · weightᵀ + bias (cblas_sgemm) ----------------------------------- */

/* out (N,OC) OVERWRITE (accum=false) or ACCUM (accum=true: out += inp·Wᵀ + b).
 * inp is (N,IC) with row stride ldi >= IC (a strided view, e.g. one input dim of φ in the
 * Fourier embedding: ldi = d*129). weight (OC,IC); bias (OC) may be NULL. Saves nothing beyond
 * its input (the backward needs inp and weight). N may be 0. */
void qc_linear_forward_cpu(float *out, const float *inp, int64_t ldi, const float *weight,
                           const float *bias, int64_t N, int64_t IC, int64_t OC, bool accum);
/* dinp (N,IC) with row stride lddi: OVERWRITE (accum=false) or ACCUM; may be NULL.
 * dweight (OC,IC) ACCUM, may be NULL; dbias (OC) ACCUM, may be NULL (summed over rows in
 * ascending order). dout (N,OC); inp (N,IC) with row stride ldi; weight (OC,IC). */
void qc_linear_backward_cpu(float *dinp, int64_t lddi, float *dweight, float *dbias,
                            const float *dout, const float *inp, int64_t ldi, const float *weight,
                            int64_t N, int64_t IC, int64_t OC, bool accum);

/* ---- layernorm over the last dim, eps QC_LAYERNORM_EPS ---------------------------------- */

/* out (N,C) OVERWRITE = (x - mean) * rstd * weight + bias, biased variance. mean, rstd (N)
 * OVERWRITE, saved for backward; may be NULL (eval). inp (N,C); weight, bias (C).
 * In place (out == inp) allowed. */
void qc_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int64_t N, int64_t C);
/* dinp (N,C) OVERWRITE or ACCUM (accum); dweight, dbias (C) ACCUM, may be NULL.
 * dout (N,C); inp (N,C), mean, rstd (N) as saved by the forward; weight (C). */
void qc_layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *mean, const float *rstd,
                               const float *weight, int64_t N, int64_t C, bool accum);

/* ---- elementwise activations (forward OVERWRITE, in place allowed) ----------------------- */
/* Backwards take the forward OUTPUT (what in-place PyTorch saves), dinp OVERWRITE, and may run
 * in place (dinp == dout). */

void qc_relu_forward_cpu(float *out, const float *inp, int64_t n);
/* dinp = dout * (out > 0) */
void qc_relu_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n);
/* ELU, alpha 1: x > 0 ? x : expm1(x) */
void qc_elu_forward_cpu(float *out, const float *inp, int64_t n);
/* dinp = out > 0 ? dout : dout * (out + 1) */
void qc_elu_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n);
void qc_sigmoid_forward_cpu(float *out, const float *inp, int64_t n);
/* dinp = dout * out * (1 - out) */
void qc_sigmoid_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n);
void qc_tanh_forward_cpu(float *out, const float *inp, int64_t n);
/* dinp = dout * (1 - out²) */
void qc_tanh_backward_cpu(float *dinp, const float *dout, const float *out, int64_t n);

/* ---- small elementwise arithmetic ------------------------------------------------------- */

/* out = a + b (n). OVERWRITE; out may alias a or b. Backward: both inputs get dout. */
void qc_add_forward_cpu(float *out, const float *a, const float *b, int64_t n);
/* out = inp + s (n), s added in fp32 (e.g. the +1 and +0.1 of the scale heads). In place ok. */
void qc_add_scalar_forward_cpu(float *out, const float *inp, float s, int64_t n);
/* Gated update of the attention layer (QCNET.md §3.3 step 9): out = u + g ⊙ (s − u). OVERWRITE,
 * out may alias u. All (n). */
void qc_gate_update_forward_cpu(float *out, const float *u, const float *g, const float *s,
                                int64_t n);
/* du = dout - dout*g, dg = dout*(s - u), ds = dout*g; each (n) OVERWRITE, each may be NULL. */
void qc_gate_update_backward_cpu(float *du, float *dg, float *ds, const float *dout, const float *u,
                                 const float *g, const float *s, int64_t n);

/* ---- dropout (Philox, qc_philox.h) ------------------------------------------------------- */

/* out (n) OVERWRITE = keep(i) ? inp * scale : 0; identity copy when d->p == 0. In place ok.
 * Saves nothing: the mask is redrawn from (seed, step, block, index). */
void qc_dropout_forward_cpu(float *out, const float *inp, int64_t n, const struct qc_dropout *d);
/* dinp (n) OVERWRITE = keep(i) ? dout * scale : 0. In place ok. */
void qc_dropout_backward_cpu(float *dinp, const float *dout, int64_t n, const struct qc_dropout *d);

/* ---- embedding lookup ------------------------------------------------------------------- */

/* out (N,C) OVERWRITE = table[idx[n]]; idx (N) in [0,V); table (V,C). */
void qc_embedding_forward_cpu(float *out, const int64_t *idx, const float *table, int64_t N,
                              int64_t C, int64_t V);
/* dtable (V,C) ACCUM += dout[n] for each n, in ascending n for every row (deterministic). */
void qc_embedding_backward_cpu(float *dtable, const float *dout, const int64_t *idx, int64_t N,
                               int64_t C, int64_t V);

/* ---- cumsum along the middle axis of (outer, L, inner) ---------------------------------- */

/* out[o,l,i] = Σ_{l' <= l} inp[o,l',i] (ascending l, a double accumulator rounded to fp32 at
 * each l, as PyTorch's CPU cumsum: an fp32 accumulator put scale_propose twice as far from
 * float64, docs/NUMERICS.md). OVERWRITE, in place ok. */
void qc_cumsum_forward_cpu(float *out, const float *inp, int64_t outer, int64_t L, int64_t inner);
/* dinp[o,l,i] = Σ_{l' >= l} dout[o,l',i] (descending l, double accumulator). OVERWRITE, in
 * place ok. */
void qc_cumsum_backward_cpu(float *dinp, const float *dout, int64_t outer, int64_t L,
                            int64_t inner);

/* ---- layout: concat / split / repeat / tile / transpose -------------------------------- */

/* Strided 2-D copy: dst[r, 0..cols) (=|+=) src[r, 0..cols), row strides ld_dst, ld_src.
 * Concat along the last dim = copies into column offsets of dst; split = copies out of them;
 * each is the other's backward (use accum = true when the destination already holds a grad). */
void qc_copy2d_cpu(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows,
                   int64_t cols, bool accum);
/* repeat_interleave rows: out[n*R + r] = inp[n]. out (N*R,C) OVERWRITE, inp (N,C). */
void qc_repeat_interleave_forward_cpu(float *out, const float *inp, int64_t N, int64_t R,
                                      int64_t C);
/* dinp[n] (=|+=) Σ_{r=0..R-1} dout[n*R + r] (ascending r). dinp (N,C), dout (N*R,C). */
void qc_repeat_interleave_backward_cpu(float *dinp, const float *dout, int64_t N, int64_t R,
                                       int64_t C, bool accum);
/* tile (torch .repeat(R,1)): out[r*N + n] = inp[n]. out (R*N,C) OVERWRITE; N = 1 broadcasts. */
void qc_tile_forward_cpu(float *out, const float *inp, int64_t N, int64_t R, int64_t C);
/* dinp[n] (=|+=) Σ_{r=0..R-1} dout[r*N + n] (ascending r). */
void qc_tile_backward_cpu(float *dinp, const float *dout, int64_t N, int64_t R, int64_t C,
                          bool accum);
/* out[d1,d0,:] = inp[d0,d1,:]: (D0,D1,C) -> (D1,D0,C), e.g. [A,T,C] -> [T,A,C] or the decoder's
 * agent-major [A,K,C] <-> mode-major [K,A,C]. OVERWRITE; out must not alias inp. */
void qc_transpose01_forward_cpu(float *out, const float *inp, int64_t D0, int64_t D1, int64_t C);
/* dinp (D0,D1,C) OVERWRITE from dout (D1,D0,C). */
void qc_transpose01_backward_cpu(float *dinp, const float *dout, int64_t D0, int64_t D1, int64_t C);

/* ---- CSR, gather and scatter ------------------------------------------------------------ */

/* Builds the CSR of an index array (host helper, also used by tests): ptr (nseg+1) and perm
 * (nitem) OVERWRITE, grouping item e under segment idx[e], ascending e within a segment (stable
 * counting sort). idx values in [0, nseg). No scratch. */
void qc_csr_build_cpu(int64_t *ptr, int64_t *perm, const int64_t *idx, int64_t nitem, int64_t nseg);

/* index_select: out[e] (=|+=) inp[idx[e]]. out (E,C), idx (E) in [0,N), inp (N,C). */
void qc_gather_rows_forward_cpu(float *out, const float *inp, const int64_t *idx, int64_t E,
                                int64_t C, bool accum);
/* dinp[n] (=|+=) Σ_{e: idx[e]=n} dout[e], in CSR order. csr groups the E gathered items by the
 * row they read (csr.seg = idx, csr.nseg = N, csr.nitem = E). dinp (N,C); rows never read get 0
 * (OVERWRITE) or are untouched (ACCUM). */
void qc_gather_rows_backward_cpu(float *dinp, const float *dout, struct qc_csr csr, int64_t C,
                                 bool accum);
/* Scatter-add over segments: out[s] (=|+=) Σ_{k=ptr[s]..ptr[s+1]-1} inp[perm[k]] in that order.
 * out (nseg,C), inp (nitem,C); empty segments give 0 (OVERWRITE). */
void qc_scatter_add_forward_cpu(float *out, const float *inp, struct qc_csr csr, int64_t C,
                                bool accum);
/* dinp[e] (=|+=) dout[csr.seg[e]]. dinp (nitem,C), dout (nseg,C). */
void qc_scatter_add_backward_cpu(float *dinp, const float *dout, struct qc_csr csr, int64_t C,
                                 bool accum);

/* ---- graph attention pieces (QCNET.md §3.3 steps 5, 6, 8) ------------------------------- */

/* Edge score without materialising q_i: score[e,h] = (Σ_{c<Dh} q[seg[e],h,c] · k[e,h,c]) · scale,
 * the sum in ascending c from 0, then one multiply (scale 0.25 for Dh = 16).
 * score (E,H) OVERWRITE; q (Nd,H*Dh); k (E,H*Dh) (k̃: per-edge keys); csr over destinations. */
void qc_attn_score_forward_cpu(float *score, const float *q, const float *k, struct qc_csr csr,
                               int64_t H, int64_t Dh, float scale);
/* dq (Nd,H*Dh) (=|+=) Σ_{e→i, CSR order} dscore[e,h]·scale·k[e,h,:], may be NULL;
 * dk (E,H*Dh) OVERWRITE = dscore[e,h]·scale·q[seg[e],h,:], may be NULL. */
void qc_attn_score_backward_cpu(float *dq, float *dk, const float *dscore, const float *q,
                                const float *k, struct qc_csr csr, int64_t H, int64_t Dh,
                                float scale, bool accum);

/* Segment softmax per head (PyG softmax, QCNET.md §4.4): M = max over the segment (no grad),
 * ex = exp(s - M), S = Σ ex (CSR order) + QC_SOFTMAX_EPS, out = ex / S.
 * out (E,H) OVERWRITE (may alias score). seg_max, seg_sum (nseg,H) OVERWRITE: the statistics
 * (S includes the eps); may be NULL; empty segments get max 0, sum QC_SOFTMAX_EPS. */
void qc_segment_softmax_forward_cpu(float *out, float *seg_max, float *seg_sum, const float *score,
                                    struct qc_csr csr, int64_t H);
/* dscore[e,h] = out[e,h]·(dout[e,h] − Σ_{e'∈seg} out[e',h]·dout[e',h]). OVERWRITE, may alias
 * dout. out is the forward's output (α). */
void qc_segment_softmax_backward_cpu(float *dscore, const float *dout, const float *out,
                                     struct qc_csr csr, int64_t H);

/* Weighted aggregation with optional attention dropout, never materialising messages:
 * out[i,h,:] = Σ_{e→i, CSR order} α'[e,h]·v[e,h,:], α' = dropout(α) with element index e*H + h
 * (drop may be NULL = off). out (Nd,H*Dh) OVERWRITE, empty segments 0; alpha (E,H);
 * v (E,H*Dh) (ṽ: per-edge values). */
void qc_attn_aggregate_forward_cpu(float *out, const float *alpha, const float *v,
                                   struct qc_csr csr, int64_t H, int64_t Dh,
                                   const struct qc_dropout *drop);
/* dalpha (E,H) OVERWRITE = keep·scale·Σ_c dout[seg[e],h,c]·v[e,h,c] (the gradient w.r.t. the
 * pre-dropout α), may be NULL; dv (E,H*Dh) OVERWRITE = α'[e,h]·dout[seg[e],h,:], may be NULL. */
void qc_attn_aggregate_backward_cpu(float *dalpha, float *dv, const float *dout, const float *alpha,
                                    const float *v, struct qc_csr csr, int64_t H, int64_t Dh,
                                    const struct qc_dropout *drop);

/* ---- Fourier embedding, elementwise part (QCNET.md §3.1 steps 1–2) ---------------------- */

/* θ[n,i,f] = ((c[n,i] · W[i,f]) · 2) · π_f (three fp32 multiplies);
 * phi[n,i,:] = [cos θ[n,i,0..F), sin θ[n,i,0..F), c[n,i]] (2F+1 features).
 * phi (N,D,2F+1) OVERWRITE; c (N,D); freqs (D,F). Saves nothing (backward recomputes θ). */
void qc_fourier_features_forward_cpu(float *phi, const float *c, const float *freqs, int64_t N,
                                     int64_t D, int64_t F);
/* dθ = −dcos·sin θ + dsin·cos θ; dc[n,i] OVERWRITE = dphi[n,i,2F] + Σ_f dθ·W[i,f]·2·π_f (may be
 * NULL); dfreqs[i,f] ACCUM += Σ_n dθ·c[n,i]·2·π_f, ascending n (may be NULL).
 * dphi (N,D,2F+1); c (N,D); freqs (D,F). */
void qc_fourier_features_backward_cpu(float *dc, float *dfreqs, const float *dphi, const float *c,
                                      const float *freqs, int64_t N, int64_t D, int64_t F);
/* The same gradients, reading cos θ and sin θ from the forward's saved output phi (N,D,2F+1)
 * instead of recomputing them (no transcendental calls: for callers that keep φ anyway, as the
 * unfused FourierEmbedding does). Bit-identical to qc_fourier_features_backward_cpu, since the
 * forward stored exactly the recomputed values. */
void qc_fourier_features_backward_saved_cpu(float *dc, float *dfreqs, const float *dphi,
                                            const float *phi, const float *c, const float *freqs,
                                            int64_t N, int64_t D, int64_t F);

/* ---- GRU (PyTorch nn.GRU, gate order r, z, n; QCNET.md §3.4) ---------------------------- */
/* Weights: w_ih (3C,IC), b_ih (3C), w_hh (3C,C), b_hh (3C); row blocks 0/1/2 = r/z/n.
 *   r = σ(W_ir x + b_ir + W_hr h + b_hr), z = σ(W_iz x + b_iz + W_hz h + b_hz),
 *   hn = W_hn h + b_hn, n = tanh(W_in x + b_in + r ⊙ hn), h' = (1 − z) ⊙ n + z ⊙ h.
 * Saved per row: gates (N,4C) = [r | z | n | hn]. */

/* scratch floats: cell forward 6*N*C (xg, hg), cell backward 6*N*C. */
int64_t qc_gru_cell_scratch_numel(int64_t N, int64_t C);
/* h_out (N,C) OVERWRITE (may not alias h); gates (N,4C) OVERWRITE, may be NULL; x (N,IC); h (N,C).
 */
void qc_gru_cell_forward_cpu(float *h_out, float *gates, const float *x, const float *h,
                             const float *w_ih, const float *b_ih, const float *w_hh,
                             const float *b_hh, int64_t N, int64_t IC, int64_t C, float *scratch);
/* dx (N,IC) OVERWRITE, may be NULL; dh (N,C) OVERWRITE (grad of the input state), may be NULL;
 * dw_ih, db_ih, dw_hh, db_hh ACCUM, each may be NULL; dh_out (N,C); gates as saved; x, h the
 * forward inputs. */
void qc_gru_cell_backward_cpu(float *dx, float *dh, float *dw_ih, float *db_ih, float *dw_hh,
                              float *db_hh, const float *dh_out, const float *gates, const float *x,
                              const float *h, const float *w_ih, const float *w_hh, int64_t N,
                              int64_t IC, int64_t C, float *scratch);

/* Sequence over L steps (time-major input). scratch floats: forward 3*L*N*C + 3*N*C,
 * backward 6*L*N*C + N*C. */
int64_t qc_gru_forward_scratch_numel(int64_t L, int64_t N, int64_t C);
int64_t qc_gru_backward_scratch_numel(int64_t L, int64_t N, int64_t C);
/* hs (L+1,N,C) OVERWRITE: hs[0] = h0, hs[t+1] = state after step t; the output is hs[L]. hs is
 * saved for backward (with gates). gates (L,N,4C) OVERWRITE, may be NULL (eval). x (L,N,IC);
 * h0 (N,C) (a broadcast parameter is tiled by the caller). */
void qc_gru_forward_cpu(float *hs, float *gates, const float *x, const float *h0, const float *w_ih,
                        const float *b_ih, const float *w_hh, const float *b_hh, int64_t L,
                        int64_t N, int64_t IC, int64_t C, float *scratch);
/* Backward from the gradient of the final state only (QCNet uses h_L only).
 * dx (L,N,IC) OVERWRITE, may be NULL; dh0 (N,C) OVERWRITE, may be NULL; dw_*, db_* ACCUM;
 * dh_last (N,C); hs, gates as saved; x the input. */
void qc_gru_backward_cpu(float *dx, float *dh0, float *dw_ih, float *db_ih, float *dw_hh,
                         float *db_hh, const float *dh_last, const float *hs, const float *gates,
                         const float *x, const float *w_ih, const float *w_hh, int64_t L, int64_t N,
                         int64_t IC, int64_t C, float *scratch);

/* ---- row-wise log_softmax and logsumexp ------------------------------------------------- */

/* out[n,k] = x − m − log(Σ_k exp(x − m)), m = row max. out (N,K) OVERWRITE. */
void qc_log_softmax_forward_cpu(float *out, const float *inp, int64_t N, int64_t K);
/* dinp = dout − exp(out)·Σ_k dout. OVERWRITE; may alias dout. */
void qc_log_softmax_backward_cpu(float *dinp, const float *dout, const float *out, int64_t N,
                                 int64_t K);
/* out[n] = log(Σ_k exp(x − m)) + m (m = row max; m = 0 when infinite, as PyTorch). out (N). */
void qc_logsumexp_forward_cpu(float *out, const float *inp, int64_t N, int64_t K);
/* dinp[n,k] = dout[n]·exp(inp[n,k] − out[n]). OVERWRITE. */
void qc_logsumexp_backward_cpu(float *dinp, const float *dout, const float *inp, const float *out,
                               int64_t N, int64_t K);

/* ---- loss pieces (QCNET.md §6.1) -------------------------------------------------------- */

/* Laplace NLL per element: nll = log(2·σc) + |y − μ|/σc, σc = max(σ, QC_LAPLACE_SCALE_MIN).
 * nll (n) OVERWRITE. */
void qc_laplace_nll_forward_cpu(float *nll, const float *mu, const float *scale, const float *y,
                                int64_t n);
/* dmu = dnll·(−sign(y − μ))/σc, dscale = dnll·(1/σc − |y − μ|/σc²): the clamp is invisible to
 * the gradient (evaluated at σc, passed straight to σ). Each (n) OVERWRITE, may be NULL. */
void qc_laplace_nll_backward_cpu(float *dmu, float *dscale, const float *dnll, const float *mu,
                                 const float *scale, const float *y, int64_t n);

/* Best mode on the proposal: ℓ[a,k] = Σ_s mask[a,s]·‖loc[a,k,s] − gt[a,s,0:2]‖₂ (fp32, ascending
 * s), best[a] = argmin_k ℓ (ties to the first k; no valid step gives 0). best (A) OVERWRITE;
 * loc (A,K,S,2); gt (A,S,gt_stride) (x, y first; stride 3 for [x, y, heading]); mask (A,S) 0/1. */
void qc_best_mode_cpu(int64_t *best, const float *loc, const float *gt, int64_t gt_stride,
                      const uint8_t *mask, int64_t A, int64_t K, int64_t S);

/* Regression loss of one trajectory set (propose or refine):
 *   L[a,s] = (nll_x + nll_y)(loc/scale[a,best[a],s], gt[a,s])·mask[a,s],
 *   loss = (1/S)·Σ_s (Σ_a L[a,s]) / n[s],   n[s] = count[s], or max(1, Σ_a mask[a,s]) when
 *   count is NULL (count: the denominators of a larger batch these agents are a part of, so
 *   the parts' losses add up to the whole's).
 * loss (1) OVERWRITE; loc, scale (A,K,S,2); best (A). scratch floats: qc_reg_loss_scratch_numel. */
int64_t qc_reg_loss_scratch_numel(int64_t A, int64_t S);
void qc_reg_loss_forward_cpu(float *loss, const float *loc, const float *scale, const int64_t *best,
                             const float *gt, int64_t gt_stride, const uint8_t *mask,
                             const float *count, int64_t A, int64_t K, int64_t S, float *scratch);
/* dloc, dscale (A,K,S,2) OVERWRITE (zero off the best mode and at masked steps), each may be
 * NULL; dloss (1) the upstream gradient of the scalar. */
void qc_reg_loss_backward_cpu(float *dloc, float *dscale, const float *dloss, const float *loc,
                              const float *scale, const int64_t *best, const float *gt,
                              int64_t gt_stride, const uint8_t *mask, const float *count, int64_t A,
                              int64_t K, int64_t S, float *scratch);

/* Classification loss (mixture NLL of the endpoint, trajectories treated as constants):
 *   n[a,k] = (nll_x·m + nll_y·m)(loc/scale[a,k,S−1], gt[a,S−1]), m = reg_mask[a,S−1],
 *   cls[a] = −logsumexp_k(log_softmax(pi[a])_k − n[a,k]),
 *   loss = Σ_a cls[a]·cls_mask[a] / n,   n = count[0], or max(1, Σ_a cls_mask[a]) when count is
 *   NULL (as for the regression loss).
 * loss (1) OVERWRITE; pi (A,K) logits; loc, scale (A,K,S,2); reg_mask (A,S); cls_mask (A).
 * K <= QC_KERNELS_MAX_MODES. */
void qc_mixture_nll_forward_cpu(float *loss, const float *pi, const float *loc, const float *scale,
                                const float *gt, int64_t gt_stride, const uint8_t *reg_mask,
                                const uint8_t *cls_mask, const float *count, int64_t A, int64_t K,
                                int64_t S);
/* dpi (A,K) OVERWRITE; dloss (1). Recomputes what it needs from the inputs. */
void qc_mixture_nll_backward_cpu(float *dpi, const float *dloss, const float *pi, const float *loc,
                                 const float *scale, const float *gt, int64_t gt_stride,
                                 const uint8_t *reg_mask, const uint8_t *cls_mask,
                                 const float *count, int64_t A, int64_t K, int64_t S);

/* ---- AdamW (QCNET.md §1; PyTorch 2.0 order) --------------------------------------------- */
/* For each element, with bc1 = 1 − β1ⁿ, bc2 = 1 − β2ⁿ (double), scalars rounded to fp32:
 *   p ← p·(1 − lr·wd);  m ← m + (1 − β1)·(g − m) (lerp);  v ← v·β2 + (1 − β2)·g·g;
 *   denom = sqrt(v)/sqrt(bc2) + eps;  p ← p + (−lr/bc1)·(m/denom).
 * param, m, v (n) updated in place; grad (n). */
void qc_adamw_step_cpu(float *param, float *m, float *v, const float *grad, int64_t n,
                       const struct qc_adamw_hparams *hp);
/* The same over a flat parameter array split into nseg tensors: tensor s covers
 * [offsets[s], offsets[s+1]) and uses weight decay hp->weight_decay when decay[s] != 0, else 0
 * (the decay / no_decay groups of QCNET.md §2.5). offsets (nseg+1), decay (nseg). */
void qc_adamw_step_segments_cpu(float *param, float *m, float *v, const float *grad,
                                const int64_t *offsets, const uint8_t *decay, int64_t nseg,
                                const struct qc_adamw_hparams *hp);

/* ---- mixed precision (qc_half.h, docs/PRECISION.md) ---------------------------------------- */

/* out[i] = inp[i] rounded to precision prec (enum qc_precision; fp32 copies). In place is
 * allowed (out == inp). OVERWRITE. */
void qc_round_forward_cpu(float *out /* (n) */, const float *inp /* (n) */, int64_t n, int prec);
/* dst[i] = the 16 bits of src[i] in precision prec (bf16 or fp16), rounded to nearest even.
 * OVERWRITE. */
void qc_pack16_cpu(uint16_t *dst /* (n) */, const float *src /* (n) */, int64_t n, int prec);
/* x[i] *= s in place (fp32; unscaling the gradients of a loss-scaled fp16 step by a power of 2
 * is exact). */
void qc_scale_inplace_cpu(float *x /* (n) */, float s, int64_t n);
/* dst[i] = src[i] widened to fp32 (exact). OVERWRITE. */
void qc_unpack16_cpu(float *dst /* (n) */, const uint16_t *src /* (n) */, int64_t n, int prec);

#ifdef __cplusplus
}
#endif

/* The CUDA launchers: the same ops with a trailing cudaStream_t (CUDA builds only). */
#ifdef QC_HAVE_CUDA
#    include "qc_kernels_cuda.h"
#endif

#endif /* QC_KERNELS_QC_KERNELS_H */
