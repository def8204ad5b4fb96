/*
 * stash.c — parameter tables and stash tables of the blocks (qc_stash.h).
 */
#include "qc_stash.h"

#include "qc_memctx.h"

#include "qc_exec.h"
#include "qc_half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- block memory ------------------------------------------------------------------------

void qc_block_mem_set(struct qc_block_mem *bm, struct qc_memctx *mc, const char *name)
{
    bm->mc = mc;
    snprintf(bm->name, sizeof bm->name, "%s", name && *name ? name : "block");
}

/* snprintf(dst, cap, "%s/%s", a, b) without the format interpreter (this runs for every block
 * allocation, the planner's dry runs included, where snprintf was a third of the time). */
static void tag_join(char *dst, size_t cap, const char *a, const char *b)
{
    size_t k = strnlen(a, cap - 1);
    memcpy(dst, a, k);
    if (k < cap - 1)
        dst[k++] = '/';
    const size_t nb = strnlen(b, cap - 1 - k);
    memcpy(dst + k, b, nb);
    dst[k + nb] = '\0';
}

void *qc_block_alloc(const struct qc_block_mem *bm, size_t bytes, const char *tensor)
{
    char tag[QC_BLOCK_NAME_MAX + 64];
    tag_join(tag, sizeof tag, bm && bm->name[0] ? bm->name : "block", tensor);
    return qc_memctx_alloc(bm ? bm->mc : NULL, QC_MEM_BLOCK, bytes ? bytes : 1, tag);
}

void qc_block_free(const struct qc_block_mem *bm, void *p, size_t bytes)
{
    qc_memctx_free(bm ? bm->mc : NULL, QC_MEM_BLOCK, p, bytes ? bytes : 1);
}

// ---- parameter table ----------------------------------------------------------------------

void qc_param_table_init(struct qc_param_table *t)
{
    memset(t, 0, sizeof *t);
}

int64_t qc_param_table_add(struct qc_param_table *t, const char *name, int ndim, int64_t ne0,
                           int64_t ne1, enum qc_param_init init)
{
    QC_ASSERT(t->n < QC_PARAM_MAX, "parameter table full at %s", name);
    QC_ASSERT(ndim == 1 || ndim == 2, "%s: ndim %d", name, ndim);
    QC_ASSERT(strlen(name) < QC_PARAM_NAME_MAX, "parameter name too long: %s", name);
    struct qc_param_spec *p = &t->p[t->n++];
    memset(p, 0, sizeof *p);
    strcpy(p->name, name);
    p->ndim = ndim;
    p->ne[0] = ne0;
    p->ne[1] = ndim == 2 ? ne1 : 1;
    p->numel = ne0 * p->ne[1];
    p->offset = t->numel;
    p->init = init;
    t->numel += p->numel;
    return p->offset;
}

int qc_param_table_find(const struct qc_param_table *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->p[i].name, name) == 0)
            return i;
    return -1;
}

/* splitmix64 -> uniform double in [0, 1) */
static double param_uniform(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

void qc_param_table_init_qcnet(const struct qc_param_table *t, float *w, uint64_t seed)
{
    uint64_t state = seed ^ 0x51ed2700u;
    for (int i = 0; i < t->n; i++) {
        const struct qc_param_spec *p = &t->p[i];
        float *x = w + p->offset;
        switch (p->init) {
        case QC_INIT_LINEAR_W: {
            double a = sqrt(6.0 / (double)(p->ne[0] + p->ne[1]));
            for (int64_t j = 0; j < p->numel; j++)
                x[j] = (float)((2.0 * param_uniform(&state) - 1.0) * a);
            break;
        }
        case QC_INIT_ZERO:
            memset(x, 0, (size_t)p->numel * sizeof *x);
            break;
        case QC_INIT_ONE:
            for (int64_t j = 0; j < p->numel; j++)
                x[j] = 1.0f;
            break;
        case QC_INIT_EMBEDDING:
            for (int64_t j = 0; j < p->numel; j++) {
                double u1 = param_uniform(&state), u2 = param_uniform(&state);
                double g = sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
                x[j] = (float)(0.02 * g);
            }
            break;
        }
    }
}

// ---- stash table --------------------------------------------------------------------------

#define STASH_ALIGN ((size_t)64)

static size_t stash_dtype_size(enum qc_stash_dtype dt)
{
    switch (dt) {
    case QC_STASH_F32:
    case QC_STASH_I32:
        return 4;
    case QC_STASH_U8:
        return 1;
    }
    return 0;
}

static const char *stash_dtype_str(enum qc_stash_dtype dt)
{
    switch (dt) {
    case QC_STASH_F32:
        return "f32";
    case QC_STASH_I32:
        return "i32";
    case QC_STASH_U8:
        return "u8";
    }
    return "?";
}

void qc_stash_init(struct qc_stash *s, const char *block)
{
    memset(s, 0, sizeof *s);
    snprintf(s->block, sizeof s->block, "%s", block);
}

void qc_stash_deinit(struct qc_stash *s)
{
    if (!s)
        return;
    qc_stash_release(s);
    s->n = 0;
    s->arena_bytes = 0;
    s->packed_arena_bytes = 0;
    s->packed = false;
}

/* LayerNorm and softmax statistics stay fp32 (docs/PRECISION.md): names ending in mean, rstd,
 * ".max" or ".sum". */
static bool stash_is_stat(const char *name)
{
    static const char *const suffix[] = {"mean", "rstd", ".max", ".sum"};
    const size_t n = strlen(name);
    for (size_t i = 0; i < sizeof suffix / sizeof *suffix; i++) {
        const size_t k = strlen(suffix[i]);
        if (n >= k && strcmp(name + n - k, suffix[i]) == 0)
            return true;
    }
    return false;
}

int qc_stash_add(struct qc_stash *s, const char *name, enum qc_stash_dtype dtype, int ndim,
                 int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3)
{
    QC_ASSERT(s->n < QC_STASH_MAX, "stash %s full at %s", s->block, name);
    QC_ASSERT(ndim >= 1 && ndim <= 4, "stash %s: %s: ndim %d", s->block, name, ndim);
    QC_ASSERT(!s->arena, "stash %s: add %s after memory was bound", s->block, name);
    QC_ASSERT(strlen(name) < QC_STASH_NAME_MAX, "stash entry name too long: %s", name);
    struct qc_stash_entry *e = &s->e[s->n];
    memset(e, 0, sizeof *e);
    strcpy(e->name, name);
    e->dtype = dtype;
    e->ndim = ndim;
    int64_t ne[4] = {ne0, ne1, ne2, ne3};
    int64_t numel = 1;
    for (int d = 0; d < 4; d++) {
        e->ne[d] = d < ndim ? ne[d] : 1;
        QC_ASSERT(e->ne[d] >= 0, "stash %s: %s: negative dim", s->block, name);
        numel *= e->ne[d];
    }
    e->bytes = (size_t)numel * stash_dtype_size(dtype);
    e->offset = s->arena_bytes;
    s->arena_bytes += (e->bytes + STASH_ALIGN - 1) / STASH_ALIGN * STASH_ALIGN;
    e->stat = dtype == QC_STASH_F32 && stash_is_stat(name);
    e->pbytes = dtype == QC_STASH_F32 && !e->stat ? (size_t)numel * 2 : e->bytes;
    e->poffset = s->packed_arena_bytes;
    s->packed_arena_bytes += (e->pbytes + STASH_ALIGN - 1) / STASH_ALIGN * STASH_ALIGN;
    return s->n++;
}

void qc_stash_bind(struct qc_stash *s, void *base)
{
    QC_ASSERT(((uintptr_t)base % STASH_ALIGN) == 0 || s->arena_bytes == 0,
              "stash %s: base not 64-byte aligned", s->block);
    qc_stash_release(s);
    s->arena = base;
    s->owned = false;
    for (int i = 0; i < s->n && !s->packed; i++)
        s->e[i].data = (char *)base + s->e[i].offset;
}

enum qc_status qc_stash_alloc(struct qc_stash *s)
{
    qc_stash_release(s);
    size_t n = s->arena_bytes ? s->arena_bytes : STASH_ALIGN;
    void *p = aligned_alloc(STASH_ALIGN, n);
    if (!p)
        return qc_errorf(QC_ERR_NOMEM, "stash %s: cannot allocate %zu bytes", s->block, n);
    qc_stash_bind(s, p);
    s->owned = true;
    return QC_OK;
}

void qc_stash_release(struct qc_stash *s)
{
    if (s->owned)
        free(s->arena);
    s->arena = NULL;
    s->owned = false;
    for (int i = 0; i < s->n; i++)
        s->e[i].data = NULL;
}

size_t qc_stash_bytes(const struct qc_stash *s)
{
    size_t b = 0;
    for (int i = 0; i < s->n; i++)
        b += s->packed ? s->e[i].pbytes : s->e[i].bytes;
    return b;
}

int qc_stash_find(const struct qc_stash *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->e[i].name, name) == 0)
            return i;
    return -1;
}

static void *stash_data(const struct qc_stash *s, int i, enum qc_stash_dtype dt)
{
    QC_ASSERT(i >= 0 && i < s->n, "stash %s: entry %d of %d", s->block, i, s->n);
    QC_ASSERT(s->e[i].dtype == dt, "stash %s: %s is %s", s->block, s->e[i].name,
              stash_dtype_str(s->e[i].dtype));
    QC_ASSERT(s->e[i].data, "stash %s: %s has no memory bound", s->block, s->e[i].name);
    return s->e[i].data;
}

float *qc_stash_f32(const struct qc_stash *s, int i)
{
    return stash_data(s, i, QC_STASH_F32);
}

int32_t *qc_stash_i32(const struct qc_stash *s, int i)
{
    return stash_data(s, i, QC_STASH_I32);
}

uint8_t *qc_stash_u8(const struct qc_stash *s, int i)
{
    return stash_data(s, i, QC_STASH_U8);
}

void qc_stash_print(const struct qc_stash *s, FILE *out)
{
    for (int i = 0; i < s->n; i++) {
        const struct qc_stash_entry *e = &s->e[i];
        fprintf(out, "%s %-20s %-3s [", s->block, e->name, stash_dtype_str(e->dtype));
        for (int d = 0; d < e->ndim; d++)
            fprintf(out, "%s%lld", d ? "," : "", (long long)e->ne[d]);
        fprintf(out, "] %zu\n", e->bytes);
    }
}

// ---- 16-bit storage ---------------------------------------------------------------------------

static int64_t entry_numel(const struct qc_stash_entry *e)
{
    return e->ne[0] * e->ne[1] * e->ne[2] * e->ne[3];
}

/* An entry stored in 16 bits when packed. */
static bool entry_half(const struct qc_stash *s, const struct qc_stash_entry *e)
{
    return s->precision != QC_PREC_FP32 && e->dtype == QC_STASH_F32 && !e->stat;
}

void qc_stash_set_precision(struct qc_stash *s, int precision)
{
    QC_ASSERT(precision >= 0 && precision < QC_PREC_COUNT && !s->packed, "stash %s: precision %d",
              s->block, precision);
    s->precision = precision;
}

void qc_stash_round(struct qc_stash *s, const struct qc_exec *ex)
{
    QC_ASSERT(s->arena && !s->packed, "stash %s: round without an unpacked arena", s->block);
    for (int i = 0; i < s->n; i++)
        if (entry_half(s, &s->e[i]))
            qc_op_round(ex, s->e[i].data, s->e[i].data, entry_numel(&s->e[i]), s->precision);
}

void qc_stash_pack(struct qc_stash *s, const struct qc_exec *ex, void *dst)
{
    QC_ASSERT(s->arena && !s->packed && s->precision != QC_PREC_FP32,
              "stash %s: pack needs a bound, unpacked 16-bit table", s->block);
    for (int i = 0; i < s->n; i++) {
        struct qc_stash_entry *e = &s->e[i];
        void *to = (char *)dst + e->poffset;
        if (entry_half(s, e))
            qc_op_pack16(ex, to, e->data, entry_numel(e), s->precision);
        else
            qc_op_copy(ex, to, e->data, e->bytes);
    }
    qc_stash_release(s);
    s->packed = true;
    qc_stash_bind(s, dst);
}

void qc_stash_unpack(struct qc_stash *s, const struct qc_exec *ex, void *dst)
{
    QC_ASSERT(s->arena && s->packed, "stash %s: unpack needs a bound, packed table", s->block);
    const char *src = s->arena;
    for (int i = 0; i < s->n; i++) {
        struct qc_stash_entry *e = &s->e[i];
        void *to = (char *)dst + e->offset;
        if (entry_half(s, e))
            qc_op_unpack16(ex, to, (const uint16_t *)(const void *)(src + e->poffset),
                           entry_numel(e), s->precision);
        else
            qc_op_copy(ex, to, src + e->poffset, e->bytes);
    }
    qc_stash_release(s);
    s->packed = false;
    qc_stash_bind(s, dst);
}

void qc_stash_unpacked_reset(struct qc_stash *s)
{
    QC_ASSERT(!s->arena, "stash %s: layout reset while bound", s->block);
    s->packed = false;
}
