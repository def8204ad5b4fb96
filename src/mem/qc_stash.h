/*
 * qc_stash.h — the memory tables of a block: its parameter table and its stash table.
 *
 * Parameter table. Every block lists its parameter tensors in QCNet's state_dict order with the
 * state_dict key suffix ("to_q.weight", "mlps.0.0.bias", ...), shape, element offset in the
 * block's flat parameter buffer and initialisation kind. Parameters and gradients use the same
 * layout: grads[offset .. offset+numel) is the gradient of params[offset .. offset+numel).
 *
 * Stash table. Everything a block's backward reads that the block itself produced in forward
 * (activations, statistics, masks) is one entry: name, dtype, shape, bytes and a data pointer.
 * A block first *plans* its table from the sizes of the call (qc_<block>_stash_plan: no data
 * yet), the caller then gives it memory (qc_stash_alloc, or qc_stash_bind to memory of its own,
 * e.g. from the caching allocator), forward fills it and backward reads it. A memory planner can
 * therefore size, offload or drop every stash from data alone:
 *   - keep:      leave it bound between forward and backward;
 *   - offload:   copy the arena out after forward and back before backward (one contiguous
 *                arena of qc_stash_arena_bytes() bytes, entries at 64-byte aligned offsets);
 *   - recompute: qc_stash_release() after forward, then before backward bind fresh memory and
 *                re-run the block's forward from the same inputs: every entry comes back bit
 *                for bit (dropout masks are drawn from Philox keyed by seed, step, block id and
 *                element index (scene and index within the scene for the model's sites), never
 *                from a stateful generator).
 * Block inputs (x, r, edge features, index arrays) are NOT in the table: they belong to the
 * caller, who must keep them alive until backward (backward takes them as arguments again).
 *
 * Invariants: bytes(entry) = numel * dtype size; arena_bytes = Σ round_up(bytes, 64);
 * qc_stash_bytes() = Σ bytes(entry) (what the planner counts).
 *
 * Block memory. Every byte of working memory a block touches (scratch, tiles, gradient buffers
 * of the source/edge contexts) comes from the block's memory context (qc_memctx.h; the trainer's
 * sits on the caching allocator, and on a device backend it hands out device memory). A block
 * carries a struct qc_block_mem (the context, the block's name and its backend); its
 * temporaries are tagged "<block name>/<tensor>", e.g.
 * "encoder.agent_encoder.pl2a_attn_layers.0/fused_tile.ws", class QC_MEM_BLOCK, and freed as
 * soon as they are dead (in reverse order of allocation where possible). A zeroed qc_block_mem
 * means host malloc and the CPU, so a block used alone (its tests, the op benchmarks) needs no
 * allocator.
 */
#ifndef QC_MEM_QC_STASH_H
#define QC_MEM_QC_STASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "qc_status.h"
#include "qc_types.h" /* enum qc_precision */

struct qc_exec; /* qc_exec.h */

#ifdef __cplusplus
extern "C" {
#endif

// ---- block memory ------------------------------------------------------------------------

struct qc_memctx; /* qc_memctx.h */

#define QC_BLOCK_NAME_MAX 96

/* A block's memory and backend: the memory context its temporaries come from, the tag prefix,
 * and where its ops run (qc_exec.h: CPU, CUDA or the emulated device; the context then hands
 * out memory of that backend). All zero = host malloc and CPU, tags "block/<tensor>". The
 * context and the exec are referenced, not copied: they must outlive the block's use. */
struct qc_block_mem {
    struct qc_memctx *mc;         /* NULL = host malloc */
    char name[QC_BLOCK_NAME_MAX]; /* tag prefix, e.g. a state_dict key prefix */
    const struct qc_exec *ex;     /* NULL = CPU */
};

/* Sets the context (NULL = host malloc) and name (NULL or "" = "block"; truncated to fit); ex
 * unchanged. */
void qc_block_mem_set(struct qc_block_mem *bm, struct qc_memctx *mc, const char *name);
/* The backend of the block's ops (NULL = CPU). bm may be NULL. */
static inline const struct qc_exec *qc_block_exec(const struct qc_block_mem *bm)
{
    return bm ? bm->ex : NULL;
}
/* bytes (0 is allowed: at least one byte is asked for) from the block's memory context, class
 * QC_MEM_BLOCK, tagged "<name>/<tensor>"; NULL on failure (the caller reports QC_ERR_NOMEM).
 * bm may be NULL. */
void *qc_block_alloc(const struct qc_block_mem *bm, size_t bytes, const char *tensor);
/* Gives p (NULL is a no-op) back; bytes must be the size passed to qc_block_alloc. */
void qc_block_free(const struct qc_block_mem *bm, void *p, size_t bytes);

// ---- parameter table ----------------------------------------------------------------------

#define QC_PARAM_NAME_MAX 48
#define QC_PARAM_MAX      40

/* How QCNet initialises a tensor (QCNET.md §2.4). */
enum qc_param_init {
    QC_INIT_LINEAR_W = 0, /* Xavier uniform, a = sqrt(6 / (fan_in + fan_out)) */
    QC_INIT_ZERO,         /* Linear bias, LayerNorm bias */
    QC_INIT_ONE,          /* LayerNorm weight */
    QC_INIT_EMBEDDING,    /* N(0, 0.02^2) (FourierEmbedding.freqs, Embedding) */
};

struct qc_param_spec {
    char name[QC_PARAM_NAME_MAX]; /* state_dict key suffix, e.g. "to_q.weight" */
    int ndim;                     /* 1 or 2 */
    int64_t ne[2];                /* shape as in PyTorch: [out, in] for Linear weights */
    int64_t offset;               /* elements from the start of the block's buffer */
    int64_t numel;                /* ne[0] * (ndim == 2 ? ne[1] : 1) */
    enum qc_param_init init;
};

struct qc_param_table {
    int n;
    struct qc_param_spec p[QC_PARAM_MAX];
    int64_t numel; /* Σ numel: size of the block's parameter (and gradient) buffer */
};

void qc_param_table_init(struct qc_param_table *t);
/* Appends a tensor at offset t->numel and returns its offset. Aborts past QC_PARAM_MAX. */
int64_t qc_param_table_add(struct qc_param_table *t, const char *name, int ndim, int64_t ne0,
                           int64_t ne1, enum qc_param_init init);
/* Index of the tensor named `name`, or -1. */
int qc_param_table_find(const struct qc_param_table *t, const char *name);
/* Fills w[0 .. t->numel) by QCNet's initialisation rules from a seeded generator (not PyTorch's
 * stream: the distributions match, the values do not). */
void qc_param_table_init_qcnet(const struct qc_param_table *t, float *w, uint64_t seed);

// ---- stash table --------------------------------------------------------------------------

#define QC_STASH_NAME_MAX 40
#define QC_STASH_MAX      48

enum qc_stash_dtype { QC_STASH_F32 = 0, QC_STASH_I32, QC_STASH_U8 };

struct qc_stash_entry {
    char name[QC_STASH_NAME_MAX]; /* e.g. "ln_dst.mean" */
    enum qc_stash_dtype dtype;
    int ndim;
    int64_t ne[4]; /* shape, outermost first */
    size_t bytes;  /* numel * dtype size */
    size_t offset; /* bytes from the arena start, multiple of 64 */
    void *data;    /* arena + offset while bound (and not packed), else NULL */
    /* 16-bit storage (qc_stash_pack): */
    bool stat;      /* an F32 statistic that stays fp32 in every precision (name ends in mean,
                       rstd, .max or .sum: LayerNorm and softmax statistics) */
    size_t pbytes;  /* bytes when packed: numel * 2 for the other F32 entries, else bytes */
    size_t poffset; /* offset in the packed arena, multiple of 64 */
};

struct qc_stash {
    char block[QC_STASH_NAME_MAX]; /* owner label, e.g. "attn_unfused.app" */
    int n;
    struct qc_stash_entry e[QC_STASH_MAX];
    size_t arena_bytes; /* Σ round_up(bytes, 64) */
    void *arena;        /* bound memory or NULL */
    bool owned;         /* arena came from qc_stash_alloc */
    /* 16-bit storage: with precision bf16 or fp16 the table can be packed after forward (the
     * non-statistic F32 entries stored in 16 bits, the rest copied) and unpacked before
     * backward; rounding first (qc_stash_round) makes the round trip exact. */
    enum qc_precision precision; /* 0 (fp32) = never packed */
    bool packed;                 /* arena holds the packed layout (entries' data NULL) */
    size_t packed_arena_bytes;   /* Σ round_up(pbytes, 64) */
};

/* Empty table labelled `block`. */
void qc_stash_init(struct qc_stash *s, const char *block);
/* Frees owned memory and empties the table. */
void qc_stash_deinit(struct qc_stash *s);
/* Appends an entry of shape ne[0..ndim) (1 <= ndim <= 4) and returns its index. Must be called
 * before memory is bound. Aborts past QC_STASH_MAX. */
int qc_stash_add(struct qc_stash *s, const char *name, enum qc_stash_dtype dtype, int ndim,
                 int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
/* Binds the entries to a freshly malloc'ed arena (64-byte aligned). QC_ERR_NOMEM on failure. */
enum qc_status qc_stash_alloc(struct qc_stash *s);
/* Binds the entries to caller memory of qc_stash_arena_bytes() bytes, 64-byte aligned. The
 * caller keeps ownership. */
void qc_stash_bind(struct qc_stash *s, void *base);
/* Unbinds (and frees, when owned) the memory; the table stays, ready to be bound again. */
void qc_stash_release(struct qc_stash *s);
/* Σ entry bytes (payload, without alignment padding). */
size_t qc_stash_bytes(const struct qc_stash *s);
static inline size_t qc_stash_arena_bytes(const struct qc_stash *s)
{
    return s->packed ? s->packed_arena_bytes : s->arena_bytes;
}
/* Index of the entry named `name`, or -1. */
int qc_stash_find(const struct qc_stash *s, const char *name);
/* Typed views of entry i (asserts the dtype and that memory is bound). */
float *qc_stash_f32(const struct qc_stash *s, int i);
int32_t *qc_stash_i32(const struct qc_stash *s, int i);
uint8_t *qc_stash_u8(const struct qc_stash *s, int i);
// ---- 16-bit storage (train.precision, docs/PRECISION.md) -----------------------------------
/* Invariants: packed_arena_bytes <= arena_bytes; qc_stash_bytes() and qc_stash_arena_bytes()
 * describe the layout in force (packed or not); bind keeps the layout in force. */

/* Sets the precision the table is stored in (after the adds). */
void qc_stash_set_precision(struct qc_stash *s, int precision);
/* Rounds the non-statistic F32 entries in place to the table's precision (bound, unpacked; a
 * no-op in fp32). Ops on ex. */
void qc_stash_round(struct qc_stash *s, const struct qc_exec *ex);
/* Packs the bound, unpacked table into dst (packed_arena_bytes, 64-byte aligned) and binds it
 * there (packed); the old arena is the caller's to free. Precision must be bf16 or fp16. */
void qc_stash_pack(struct qc_stash *s, const struct qc_exec *ex, void *dst);
/* Unpacks the bound, packed table into dst (arena_bytes, 64-byte aligned) and binds it there;
 * the packed arena is the caller's to free. */
void qc_stash_unpack(struct qc_stash *s, const struct qc_exec *ex, void *dst);
/* Forgets a packed layout of an unbound table (its next binding is the full one: a recompute). */
void qc_stash_unpacked_reset(struct qc_stash *s);

/* One line per entry: "block name dtype [shape] bytes". */
void qc_stash_print(const struct qc_stash *s, FILE *out);

#ifdef __cplusplus
}
#endif

#endif /* QC_MEM_QC_STASH_H */
