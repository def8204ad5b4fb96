/*
 * adamw.cu — the AdamW step in PyTorch 2.0's order, per element exactly the CPU's arithmetic
 * (kernels/cpu/adamw.c): decoupled decay, m as a lerp, v as mul + addcmul, then
 * p ← p + (−lr/bc1)·(m / (sqrt(v)/sqrt(bc2) + eps)). Scalars are formed in double on the host
 * and rounded to fp32 once. Three launchers: one flat tensor, a flat array split into decay /
 * no-decay segments, and a fused multi-tensor step over a list of separate tensors.
 */
#include "cuda_common.cuh"
#include "kernels_internal.h"

#include <math.h>

/* One element, in the CPU's operation order. sqrtf and the divisions are IEEE-rounded (no fast
 * math); the compiler may still contract a multiply-add into an FMA. */
__device__ static inline void adamw_elem(float *param, float *m, float *v, const float *grad,
                                         int64_t i, const struct adamw_scalars &s)
{
    float g = grad[i];
    float p = param[i] * s.decay;
    float mi = m[i];
    mi = mi + s.w1 * (g - mi); /* torch.lerp with weight < 0.5 */
    float vi = v[i] * s.beta2 + s.w2 * g * g;
    float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    p = p + s.neg_step * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
}

static __global__ void adamw_kernel(float *param, float *m, float *v, const float *grad, int64_t n,
                                    struct adamw_scalars s)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        adamw_elem(param, m, v, grad, i, s);
}

void qc_adamw_step_cuda(float *param, float *m, float *v, const float *grad, int64_t n,
                        const struct qc_adamw_hparams *hp, cudaStream_t stream)
{
    QC_ASSERT(n >= 0 && hp, "adamw cuda: n %lld", (long long)n);
    struct adamw_scalars s = adamw_scalars_make(hp, hp->weight_decay);
    if (n == 0)
        return;
    adamw_kernel<<<cuda_blocks(n, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(param, m, v, grad, n, s);
    QC_CUDA_LAUNCH_CHECK();
}

/* Elements offsets[0] .. offsets[nseg] (read on the device: the launcher does not know the
 * total); element i belongs to the last segment s with offsets[s] <= i (binary search). */
static __global__ void adamw_segments_kernel(float *param, float *m, float *v, const float *grad,
                                             const int64_t *offsets, const uint8_t *decay,
                                             int64_t nseg, struct adamw_scalars with,
                                             struct adamw_scalars without)
{
    int64_t begin = offsets[0], end = offsets[nseg];
    for (int64_t i = begin + cuda_tid(); i < end; i += cuda_nthreads()) {
        int64_t lo = 0, hi = nseg; /* invariant: offsets[lo] <= i < offsets[hi] */
        while (hi - lo > 1) {
            int64_t mid = lo + (hi - lo) / 2;
            if (offsets[mid] <= i)
                lo = mid;
            else
                hi = mid;
        }
        adamw_elem(param, m, v, grad, i, decay[lo] ? with : without);
    }
}

#define ADAMW_SEGMENT_BLOCKS 2048 /* fixed grid: the element count lives on the device */

void qc_adamw_step_segments_cuda(float *param, float *m, float *v, const float *grad,
                                 const int64_t *offsets, const uint8_t *decay, int64_t nseg,
                                 const struct qc_adamw_hparams *hp, cudaStream_t stream)
{
    QC_ASSERT(nseg >= 0 && hp && offsets && (nseg == 0 || decay), "adamw segments cuda: nseg %lld",
              (long long)nseg);
    struct adamw_scalars with = adamw_scalars_make(hp, hp->weight_decay);
    struct adamw_scalars without = adamw_scalars_make(hp, 0.0);
    if (nseg == 0)
        return;
    adamw_segments_kernel<<<ADAMW_SEGMENT_BLOCKS, CUDA_BLOCK, 0, stream>>>(
        param, m, v, grad, offsets, decay, nseg, with, without);
    QC_CUDA_LAUNCH_CHECK();
}

// ---- fused multi-tensor step --------------------------------------------------------------------

/* Kernel parameter block of one launch: up to QC_ADAMW_MULTI_TENSORS tensors (~1.3 KiB). */
struct adamw_multi_args {
    float *param[QC_ADAMW_MULTI_TENSORS];
    float *m[QC_ADAMW_MULTI_TENSORS];
    float *v[QC_ADAMW_MULTI_TENSORS];
    const float *grad[QC_ADAMW_MULTI_TENSORS];
    int64_t n[QC_ADAMW_MULTI_TENSORS];
    uint8_t decay[QC_ADAMW_MULTI_TENSORS];
};

/* blockIdx.y picks the tensor; blocks along x grid-stride over its elements. */
static __global__ void adamw_multi_kernel(struct adamw_multi_args a, struct adamw_scalars with,
                                          struct adamw_scalars without)
{
    int j = (int)blockIdx.y;
    int64_t n = a.n[j];
    const struct adamw_scalars &s = a.decay[j] ? with : without;
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        adamw_elem(a.param[j], a.m[j], a.v[j], a.grad[j], i, s);
}

void qc_adamw_step_multi_cuda(const struct qc_adamw_tensor *list, int64_t count,
                              const struct qc_adamw_hparams *hp, cudaStream_t stream)
{
    QC_ASSERT(count >= 0 && hp && (count == 0 || list), "adamw multi cuda: count %lld",
              (long long)count);
    struct adamw_scalars with = adamw_scalars_make(hp, hp->weight_decay);
    struct adamw_scalars without = adamw_scalars_make(hp, 0.0);
    for (int64_t first = 0; first < count; first += QC_ADAMW_MULTI_TENSORS) {
        struct adamw_multi_args a = {};
        int nt = 0;
        int64_t max_n = 0;
        for (int64_t j = first; j < count && nt < QC_ADAMW_MULTI_TENSORS; j++, nt++) {
            const struct qc_adamw_tensor *t = &list[j];
            QC_ASSERT(t->n >= 0 && (t->n == 0 || (t->param && t->m && t->v && t->grad)),
                      "adamw multi cuda: tensor %lld: n %lld", (long long)j, (long long)t->n);
            a.param[nt] = t->param;
            a.m[nt] = t->m;
            a.v[nt] = t->v;
            a.grad[nt] = t->grad;
            a.n[nt] = t->n;
            a.decay[nt] = t->decay ? 1 : 0;
            max_n = t->n > max_n ? t->n : max_n;
        }
        if (max_n == 0)
            continue;
        dim3 grid(cuda_blocks(max_n, CUDA_BLOCK), (unsigned int)nt);
        adamw_multi_kernel<<<grid, CUDA_BLOCK, 0, stream>>>(a, with, without);
        QC_CUDA_LAUNCH_CHECK();
    }
}
