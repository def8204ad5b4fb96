/*
 * linear.c — y = x·Wᵀ + b with OpenBLAS (every GEMM of the CPU backend goes through
 * cblas_sgemm). W is (OC,IC) as in PyTorch. The input may be a strided row view (ldi >= IC).
 * The bias-gradient column sums loop rows in ascending order per column (deterministic for any
 * thread count), accumulated in double and added once.
 *
 * Large GEMMs in blocks, one thread each: OpenBLAS's own threading of these thin products (K and
 * one side 128–512, the other side thousands of rows) ran at 40–66 % of its two-thread peak,
 * one-thread calls on a few hundred rows at 90–99 % of the one-thread peak (issue 29's profile).
 * So a GEMM with at least 2·LINEAR_ROW_MIN rows (forward, dinp) is cut into row blocks, and dW
 * (a sum over the rows) into blocks of LINEAR_COL_BLOCK output features, and the blocks run on
 * an OpenMP team with OpenBLAS at one thread (cpu_team_begin). The cut depends on the shape
 * only, so a blocked GEMM gives the same bits for any thread count (smaller ones still use
 * OpenBLAS's threads, whose bits depend on the count); inside a tile loop (BLAS already at one
 * thread) the blocks run in turn.
 */
#include "qc_kernels.h"

#include <limits.h>
#include <string.h>

#include <cblas.h> /* cblas_sgemm, openblas_{get,set}_num_threads (OpenBLAS) */
#include <omp.h>

#include "cpu_internal.h"
#include "qc_status.h"

/* Columns per OpenMP work item in column reductions: a cache line of floats. */
#define LINEAR_COL_CHUNK 16
#define LINEAR_ROW_MIN   256 /* fewest rows in a row block (file comment) */
#define LINEAR_COL_BLOCK 64  /* dW: output features per block */

int qc_kernels_cpu_blas_threads(void)
{
    return openblas_get_num_threads();
}

void qc_kernels_cpu_set_blas_threads(int n)
{
    QC_ASSERT(n >= 1, "BLAS threads %d", n);
    openblas_set_num_threads(n);
}

static void check_blas_dims(int64_t a, int64_t b, int64_t c, int64_t ld)
{
    QC_ASSERT(a <= INT_MAX && b <= INT_MAX && c <= INT_MAX && ld <= INT_MAX,
              "linear: dims %lld x %lld x %lld (ld %lld) exceed the BLAS int range", (long long)a,
              (long long)b, (long long)c, (long long)ld);
}

/* Rows per block of an N-row GEMM: N itself below 2·LINEAR_ROW_MIN, else N split into
 * N / LINEAR_ROW_MIN blocks rounded up to 16 rows (the last block shorter). */
static int64_t linear_row_block(int64_t N)
{
    const int64_t nb = N / LINEAR_ROW_MIN;
    if (nb <= 1)
        return N;
    return ((N + nb - 1) / nb + 15) & ~(int64_t)15;
}

/* Threads for nblocks independent GEMM blocks: OpenBLAS's count, at most one per block; 1
 * inside a parallel region (a tile loop: the blocks run on the tile's thread). */
static int linear_team(int64_t nblocks)
{
    const int t = qc_kernels_cpu_blas_threads();
    if (nblocks <= 1 || t <= 1 || omp_in_parallel())
        return 1;
    return nblocks < t ? (int)nblocks : t;
}

/* C (M,Nc) = A·op(B) + β·C, row-major, A (M,K) not transposed, over row blocks of M. */
static void linear_gemm_rows(enum CBLAS_TRANSPOSE tb, int64_t M, int64_t Nc, int64_t K,
                             const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                             float *c, int64_t ldc)
{
    const int64_t rb = linear_row_block(M), nb = (M + rb - 1) / rb;
    const int team = linear_team(nb);
    struct cpu_team tm = {0};
    if (team > 1)
        tm = cpu_team_begin(team);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
    for (int64_t bi = 0; bi < nb; bi++) {
        const int64_t m0 = bi * rb, m = m0 + rb < M ? rb : M - m0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, (int)m, (int)Nc, (int)K, 1.0f, a + m0 * lda,
                    (int)lda, b, (int)ldb, beta, c + m0 * ldc, (int)ldc);
    }
    if (team > 1)
        cpu_team_end(tm);
}

void qc_linear_forward_cpu(float *out, const float *inp, int64_t ldi, const float *weight,
                           const float *bias, int64_t N, int64_t IC, int64_t OC, bool accum)
{
    QC_ASSERT(N >= 0 && IC > 0 && OC > 0 && ldi >= IC,
              "linear fwd: N %lld IC %lld OC %lld ldi %lld", (long long)N, (long long)IC,
              (long long)OC, (long long)ldi);
    QC_ASSERT(N == 0 || (out && inp && weight), "linear fwd: NULL tensor");
    if (N == 0)
        return;
    check_blas_dims(N, IC, OC, ldi);
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static) if (N * OC >= CPU_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            float *o = out + n * OC;
            if (accum) {
                for (int64_t c = 0; c < OC; c++)
                    o[c] += bias[c];
            } else {
                memcpy(o, bias, (size_t)OC * sizeof(float));
            }
        }
        beta = 1.0f;
    } else if (accum) {
        beta = 1.0f;
    }
    linear_gemm_rows(CblasTrans, N, OC, IC, inp, ldi, weight, IC, beta, out, OC);
}

void qc_linear_backward_cpu(float *dinp, int64_t lddi, float *dweight, float *dbias,
                            const float *dout, const float *inp, int64_t ldi, const float *weight,
                            int64_t N, int64_t IC, int64_t OC, bool accum)
{
    QC_ASSERT(N >= 0 && IC > 0 && OC > 0 && ldi >= IC && (!dinp || lddi >= IC),
              "linear bwd: N %lld IC %lld OC %lld ldi %lld lddi %lld", (long long)N, (long long)IC,
              (long long)OC, (long long)ldi, (long long)lddi);
    if (N == 0)
        return;
    QC_ASSERT(dout, "linear bwd: NULL dout");
    check_blas_dims(N, IC, OC, ldi);
    if (dinp) {
        QC_ASSERT(weight, "linear bwd: dinp needs weight");
        check_blas_dims(N, IC, OC, lddi);
        /* dinp (N,IC) = dout (N,OC) · W (OC,IC) */
        linear_gemm_rows(CblasNoTrans, N, IC, OC, dout, OC, weight, IC, accum ? 1.0f : 0.0f, dinp,
                         lddi);
    }
    if (dweight) {
        QC_ASSERT(inp, "linear bwd: dweight needs inp");
        /* dW (OC,IC) += doutᵀ (OC,N) · inp (N,IC): in blocks of output features when the rows
         * are many (file comment); each block sums all N rows in one call */
        const int64_t nb =
            N >= 2 * LINEAR_ROW_MIN ? (OC + LINEAR_COL_BLOCK - 1) / LINEAR_COL_BLOCK : 1;
        const int64_t cb = nb > 1 ? LINEAR_COL_BLOCK : OC;
        const int team = linear_team(nb);
        struct cpu_team tm = {0};
        if (team > 1)
            tm = cpu_team_begin(team);
#pragma omp parallel for schedule(static) num_threads(team) if (team > 1)
        for (int64_t bi = 0; bi < nb; bi++) {
            const int64_t o0 = bi * cb, m = o0 + cb < OC ? cb : OC - o0;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)IC, (int)N, 1.0f,
                        dout + o0, (int)OC, inp, (int)ldi, 1.0f, dweight + o0 * IC, (int)IC);
        }
        if (team > 1)
            cpu_team_end(tm);
    }
    if (dbias) {
        int64_t nchunk = (OC + LINEAR_COL_CHUNK - 1) / LINEAR_COL_CHUNK;
#pragma omp parallel for schedule(static) if (N * OC >= CPU_PAR_MIN)
        for (int64_t ch = 0; ch < nchunk; ch++) {
            int64_t c0 = ch * LINEAR_COL_CHUNK;
            int64_t c1 = c0 + LINEAR_COL_CHUNK < OC ? c0 + LINEAR_COL_CHUNK : OC;
            double acc[LINEAR_COL_CHUNK] = {0};
            if (c1 - c0 == LINEAR_COL_CHUNK) /* a constant trip count: the adds vectorize */
                for (int64_t n = 0; n < N; n++)
                    for (int j = 0; j < LINEAR_COL_CHUNK; j++)
                        acc[j] += (double)dout[n * OC + c0 + j];
            else
                for (int64_t n = 0; n < N; n++)
                    for (int64_t c = c0; c < c1; c++)
                        acc[c - c0] += (double)dout[n * OC + c];
            for (int64_t c = c0; c < c1; c++)
                dbias[c] += (float)acc[c - c0];
        }
    }
}
