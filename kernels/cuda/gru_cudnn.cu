/*
 * gru_cudnn.cu — the GRU through cuDNN's RNN API (cudnnRNNForward, cudnnRNNBackwardData_v8,
 * cudnnRNNBackwardWeights_v8; CUDNN_GRU with CUDNN_RNN_DOUBLE_BIAS). qc_kernels_cuda.h has the
 * gate mapping (cuDNN's r / update / new = PyTorch's r / z / n, linLayerID 0..2 input, 3..5
 * recurrent) and the buffer contract.
 *
 * work buffer layout: [cuDNN work space | devSeqLengths (N int32) | dy zeros (L,N,C floats)]
 * each part 256-byte aligned. cuDNN needs dy for every step; QCNet only back-propagates the final
 * state, so dy is zero and the gradient enters through dhy.
 *
 * Descriptor rules (cuDNN 8/9 RNN API; test_kernels_cuda's "gru cudnn" cases run them on a GPU):
 *   - padded I/O disabled (auxFlags CUDNN_RNN_PADDED_IO_DISABLED) goes with the packed layout
 *     CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED only (the unpacked layouts need padded I/O enabled:
 *     CUDNN_STATUS_BAD_PARAM otherwise). Every sequence has length L, so packed and unpacked
 *     seq-major memory are the same (L, N, vector) array; the lengths are sorted (all equal).
 *   - mathType: CUDNN_FMA_MATH keeps fp32 exact (no tensor cores); with TF32 CUDNN_DEFAULT_MATH,
 *     which permits TF32 on Ampere and later. (CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION would also
 *     allow down-conversion of fp32 to fp16: not what device.tf32 promises.)
 *   - hDesc: a fully packed (numLayers·dirs, N, hiddenSize) tensor; no cDesc for a GRU.
 *   - devSeqLengths: device memory (cuDNN reads it asynchronously), written on the stream.
 *   - work space: the larger of the training and inference sizes (the forward runs in both
 *     modes); the reserve space: training size, NULL with size 0 for inference.
 *   - every call that may run work binds the cuDNN handle to the caller's stream first
 *     (cuda_ctx_cudnn), the plan included.
 */
#include "cuda_common.cuh"

#include <stdlib.h>

struct qc_gru_cudnn {
    int64_t L, N, IC, C;
    struct qc_kernels_cuda *ctx;
    cudnnRNNDescriptor_t rnn;
    cudnnDropoutDescriptor_t drop;
    cudnnRNNDataDescriptor_t xdesc, ydesc;
    cudnnTensorDescriptor_t hdesc;
    size_t weight_bytes, cudnn_work_bytes, reserve_bytes;
    size_t seq_off, dy_off, work_bytes; /* offsets into the caller's work buffer */
};

static size_t align256(size_t n)
{
    return (n + 255u) & ~(size_t)255u;
}

static enum qc_status gru_cudnn_setup(struct qc_gru_cudnn *g, cudnnHandle_t h)
{
    int L = (int)g->L, N = (int)g->N, IC = (int)g->IC, C = (int)g->C;
    QC_TRY(QC_CUDNN(cudnnCreateDropoutDescriptor(&g->drop)));
    /* dropout 0: no states are needed (nothing is drawn); a single layer applies none anyway */
    QC_TRY(QC_CUDNN(cudnnSetDropoutDescriptor(g->drop, h, 0.0f, NULL, 0, 0)));
    QC_TRY(QC_CUDNN(cudnnCreateRNNDescriptor(&g->rnn)));
    cudnnMathType_t math = g->ctx->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    QC_TRY(QC_CUDNN(cudnnSetRNNDescriptor_v8(
        g->rnn, CUDNN_RNN_ALGO_STANDARD, CUDNN_GRU, CUDNN_RNN_DOUBLE_BIAS, CUDNN_UNIDIRECTIONAL,
        CUDNN_LINEAR_INPUT, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, math, IC, C, C, 1, g->drop,
        CUDNN_RNN_PADDED_IO_DISABLED)));
    int *lens = (int *)malloc((size_t)N * sizeof(int));
    if (!lens)
        return qc_errorf(QC_ERR_NOMEM, "gru cudnn: out of host memory");
    for (int i = 0; i < N; i++)
        lens[i] = L;
    enum qc_status st = QC_CUDNN(cudnnCreateRNNDataDescriptor(&g->xdesc));
    if (st == QC_OK)
        st = QC_CUDNN(cudnnSetRNNDataDescriptor(g->xdesc, CUDNN_DATA_FLOAT,
                                                CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, L, N, IC,
                                                lens, NULL));
    if (st == QC_OK)
        st = QC_CUDNN(cudnnCreateRNNDataDescriptor(&g->ydesc));
    if (st == QC_OK)
        st = QC_CUDNN(cudnnSetRNNDataDescriptor(g->ydesc, CUDNN_DATA_FLOAT,
                                                CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, L, N, C,
                                                lens, NULL));
    free(lens);
    QC_TRY(st);
    int dims[3] = {1, N, C}, strides[3] = {N * C, C, 1};
    QC_TRY(QC_CUDNN(cudnnCreateTensorDescriptor(&g->hdesc)));
    QC_TRY(QC_CUDNN(cudnnSetTensorNdDescriptor(g->hdesc, CUDNN_DATA_FLOAT, 3, dims, strides)));
    QC_TRY(QC_CUDNN(cudnnGetRNNWeightSpaceSize(h, g->rnn, &g->weight_bytes)));
    QC_TRY(QC_CUDNN(cudnnGetRNNTempSpaceSizes(h, g->rnn, CUDNN_FWD_MODE_TRAINING, g->xdesc,
                                              &g->cudnn_work_bytes, &g->reserve_bytes)));
    size_t infer_work = 0, infer_reserve = 0;
    QC_TRY(QC_CUDNN(cudnnGetRNNTempSpaceSizes(h, g->rnn, CUDNN_FWD_MODE_INFERENCE, g->xdesc,
                                              &infer_work, &infer_reserve)));
    if (infer_work > g->cudnn_work_bytes)
        g->cudnn_work_bytes = infer_work;
    g->seq_off = align256(g->cudnn_work_bytes);
    g->dy_off = g->seq_off + align256((size_t)N * sizeof(int32_t));
    g->work_bytes = g->dy_off + (size_t)(g->L * g->N * g->C) * sizeof(float);
    return QC_OK;
}

enum qc_status qc_gru_cudnn_create(int64_t L, int64_t N, int64_t IC, int64_t C, cudaStream_t stream,
                                   struct qc_gru_cudnn **out)
{
    QC_ASSERT(L > 0 && N > 0 && IC > 0 && C > 0 && L <= INT32_MAX && N * C <= INT32_MAX &&
                  IC <= INT32_MAX,
              "gru cudnn: L %lld N %lld IC %lld C %lld", (long long)L, (long long)N, (long long)IC,
              (long long)C);
    struct qc_kernels_cuda *ctx = cuda_ctx_bind(stream, "gru cudnn create");
    cudnnHandle_t h;
    QC_TRY(cuda_ctx_cudnn(ctx, stream, &h));
    struct qc_gru_cudnn *g = (struct qc_gru_cudnn *)calloc(1, sizeof(*g));
    if (!g)
        return qc_errorf(QC_ERR_NOMEM, "gru cudnn: out of host memory");
    g->L = L;
    g->N = N;
    g->IC = IC;
    g->C = C;
    g->ctx = ctx;
    enum qc_status st = gru_cudnn_setup(g, h);
    if (st != QC_OK) {
        qc_gru_cudnn_destroy(g);
        return st;
    }
    *out = g;
    return QC_OK;
}

void qc_gru_cudnn_destroy(struct qc_gru_cudnn *g)
{
    if (!g)
        return;
    if (g->hdesc)
        (void)cudnnDestroyTensorDescriptor(g->hdesc);
    if (g->ydesc)
        (void)cudnnDestroyRNNDataDescriptor(g->ydesc);
    if (g->xdesc)
        (void)cudnnDestroyRNNDataDescriptor(g->xdesc);
    if (g->rnn)
        (void)cudnnDestroyRNNDescriptor(g->rnn);
    if (g->drop)
        (void)cudnnDestroyDropoutDescriptor(g->drop);
    free(g);
}

void qc_gru_cudnn_sizes(const struct qc_gru_cudnn *g, size_t *weight_bytes, size_t *work_bytes,
                        size_t *reserve_bytes)
{
    if (weight_bytes)
        *weight_bytes = g->weight_bytes;
    if (work_bytes)
        *work_bytes = g->work_bytes;
    if (reserve_bytes)
        *reserve_bytes = g->reserve_bytes;
}

/* Addresses of linLayerID's matrix and bias inside a weight (or weight-gradient) space. */
static enum qc_status gru_cudnn_params(struct qc_gru_cudnn *g, cudnnHandle_t h, const void *space,
                                       int id, float **mat, float **bias)
{
    cudnnTensorDescriptor_t md = NULL, bd = NULL;
    void *ma = NULL, *ba = NULL;
    enum qc_status st = QC_CUDNN(cudnnCreateTensorDescriptor(&md));
    if (st == QC_OK)
        st = QC_CUDNN(cudnnCreateTensorDescriptor(&bd));
    if (st == QC_OK)
        st = QC_CUDNN(
            cudnnGetRNNWeightParams(h, g->rnn, 0, g->weight_bytes, space, id, md, &ma, bd, &ba));
    if (md)
        (void)cudnnDestroyTensorDescriptor(md);
    if (bd)
        (void)cudnnDestroyTensorDescriptor(bd);
    QC_TRY(st);
    const char *lo = (const char *)space, *hi = lo + g->weight_bytes;
    QC_ASSERT(ma && ba && (const char *)ma >= lo && (const char *)ma < hi &&
                  (const char *)ba >= lo && (const char *)ba < hi,
              "gru cudnn: linLayerID %d: parameter outside the weight space", id);
    *mat = (float *)ma;
    *bias = (float *)ba;
    return QC_OK;
}

static void d2d(void *dst, const void *src, size_t bytes, cudaStream_t stream)
{
    QC_CUDA_ASSERT(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

enum qc_status qc_gru_cudnn_pack_weights(struct qc_gru_cudnn *g, void *wspace, const float *w_ih,
                                         const float *b_ih, const float *w_hh, const float *b_hh,
                                         cudaStream_t stream)
{
    struct qc_kernels_cuda *ctx = cuda_ctx_bind(stream, "gru cudnn pack");
    cudnnHandle_t h;
    QC_TRY(cuda_ctx_cudnn(ctx, stream, &h));
    int64_t C = g->C, IC = g->IC;
    QC_TRY(QC_CUDA(cudaMemsetAsync(wspace, 0, g->weight_bytes, stream)));
    for (int gate = 0; gate < 3; gate++) { /* r, z, n = cuDNN's reset, update, new */
        float *m, *b;
        QC_TRY(gru_cudnn_params(g, h, wspace, gate, &m, &b));
        d2d(m, w_ih + gate * C * IC, (size_t)(C * IC) * sizeof(float), stream);
        d2d(b, b_ih + gate * C, (size_t)C * sizeof(float), stream);
        QC_TRY(gru_cudnn_params(g, h, wspace, 3 + gate, &m, &b));
        d2d(m, w_hh + gate * C * C, (size_t)(C * C) * sizeof(float), stream);
        d2d(b, b_hh + gate * C, (size_t)C * sizeof(float), stream);
    }
    return QC_OK;
}

static __global__ void fill_i32_kernel(int32_t *p, int64_t n, int32_t v)
{
    for (int64_t i = cuda_tid(); i < n; i += cuda_nthreads())
        p[i] = v;
}

static int32_t *gru_cudnn_seqlens(struct qc_gru_cudnn *g, void *work, cudaStream_t stream)
{
    int32_t *lens = (int32_t *)((char *)work + g->seq_off);
    fill_i32_kernel<<<cuda_blocks(g->N, CUDA_BLOCK), CUDA_BLOCK, 0, stream>>>(lens, g->N,
                                                                              (int32_t)g->L);
    QC_CUDA_LAUNCH_CHECK();
    return lens;
}

enum qc_status qc_gru_forward_cudnn(struct qc_gru_cudnn *g, float *y, float *h_last, const float *x,
                                    const float *h0, const void *wspace, void *work, void *reserve,
                                    cudaStream_t stream)
{
    QC_ASSERT(y && h_last && x && h0 && wspace && work, "gru cudnn fwd: NULL buffer");
    struct qc_kernels_cuda *ctx = cuda_ctx_bind(stream, "gru cudnn fwd");
    cudnnHandle_t h;
    QC_TRY(cuda_ctx_cudnn(ctx, stream, &h));
    int32_t *lens = gru_cudnn_seqlens(g, work, stream);
    cudnnForwardMode_t mode = reserve ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE;
    QC_TRY(QC_CUDNN(cudnnRNNForward(h, g->rnn, mode, lens, g->xdesc, x, g->ydesc, y, g->hdesc, h0,
                                    h_last, g->hdesc, NULL, NULL, g->weight_bytes, wspace,
                                    g->cudnn_work_bytes, work, reserve ? g->reserve_bytes : 0,
                                    reserve)));
    return QC_OK;
}

enum qc_status qc_gru_backward_cudnn(struct qc_gru_cudnn *g, float *dx, float *dh0, float *dw_ih,
                                     float *db_ih, float *dw_hh, float *db_hh, const float *dh_last,
                                     const float *y, const float *x, const float *h0,
                                     const void *wspace, void *dwspace, void *work, void *reserve,
                                     cudaStream_t stream)
{
    QC_ASSERT(dx && dh_last && y && x && h0 && wspace && dwspace && work && reserve,
              "gru cudnn bwd: NULL buffer");
    struct qc_kernels_cuda *ctx = cuda_ctx_bind(stream, "gru cudnn bwd");
    cudnnHandle_t h;
    QC_TRY(cuda_ctx_cudnn(ctx, stream, &h));
    int32_t *lens = gru_cudnn_seqlens(g, work, stream);
    float *dy = (float *)((char *)work + g->dy_off);
    QC_TRY(QC_CUDA(cudaMemsetAsync(dy, 0, (size_t)(g->L * g->N * g->C) * sizeof(float), stream)));
    /* data first: it fills the reserve space the weight gradient reads */
    QC_TRY(QC_CUDNN(cudnnRNNBackwardData_v8(h, g->rnn, lens, g->ydesc, y, dy, g->xdesc, dx,
                                            g->hdesc, h0, dh_last, dh0, g->hdesc, NULL, NULL, NULL,
                                            g->weight_bytes, wspace, g->cudnn_work_bytes, work,
                                            g->reserve_bytes, reserve)));
    if (!dw_ih && !db_ih && !dw_hh && !db_hh)
        return QC_OK;
    QC_TRY(QC_CUDA(cudaMemsetAsync(dwspace, 0, g->weight_bytes, stream)));
    QC_TRY(QC_CUDNN(cudnnRNNBackwardWeights_v8(
        h, g->rnn, CUDNN_WGRAD_MODE_ADD, lens, g->xdesc, x, g->hdesc, h0, g->ydesc, y,
        g->weight_bytes, dwspace, g->cudnn_work_bytes, work, g->reserve_bytes, reserve)));
    int64_t C = g->C, IC = g->IC;
    for (int gate = 0; gate < 3; gate++) { /* ACCUM the unpacked gradients (PyTorch layout) */
        float *m, *b;
        QC_TRY(gru_cudnn_params(g, h, dwspace, gate, &m, &b));
        if (dw_ih)
            qc_add_forward_cuda(dw_ih + gate * C * IC, dw_ih + gate * C * IC, m, C * IC, stream);
        if (db_ih)
            qc_add_forward_cuda(db_ih + gate * C, db_ih + gate * C, b, C, stream);
        QC_TRY(gru_cudnn_params(g, h, dwspace, 3 + gate, &m, &b));
        if (dw_hh)
            qc_add_forward_cuda(dw_hh + gate * C * C, dw_hh + gate * C * C, m, C * C, stream);
        if (db_hh)
            qc_add_forward_cuda(db_hh + gate * C, db_hh + gate * C, b, C, stream);
    }
    return QC_OK;
}
