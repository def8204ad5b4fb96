/*
 * qc_memspec.h — what one block call allocates, as data: the memory spec of a block call.
 *
 * Every block kind (FourierEmbedding, MLP, the attention edge context, source/edge context and
 * application, fused and unfused) exports a function that fills a spec for one call from its
 * sizes and the state of its contexts, without touching any tensor: the tensors the call
 * allocates (tag, bytes, zero-filled or not, and, for a tensor that outlives the call, the field
 * that holds it until a later call frees it) and the order of the allocations and frees. The
 * stash a block keeps for its backward is its stash table (qc_stash.h); the spec is everything
 * else the call touches.
 *
 * One source. The block's real code takes its memory from the spec (qc_memspec_take / _give:
 * one call turns a spec tensor into an allocation), and the planner's dry run replays the same
 * spec (qc_memspec_replay) through the dry memory context, so the program the planner simulates
 * holds the block's allocations exactly, transients included. take checks that the real code
 * allocates in the spec's order (an assertion), and tests/test_tape.c that a real step's
 * recorded program equals the dry one, event for event.
 *
 * Glossary.
 *   tensor   one allocation of the call: whose memory (struct qc_block_mem: tag prefix, context,
 *            backend), name (the tag's suffix: "<block>/<name>"), bytes, flags, home.
 *   home     for a tensor that outlives the call (a context's gradient buffer, an index array,
 *            dL/dr): the pointer field that holds it; ALLOC sets it, the FREE of a later call's
 *            spec (qc_memspec_free_home) takes it and sets it to NULL. NULL: local to the call.
 *   id       the caller's name for a tensor (a small enum of the block file), mapped to its
 *            index; an id the spec does not hold is absent: take gives NULL, give does nothing
 *            (a conditional allocation is decided once, when the spec is filled).
 *   nested   the tensors of a nested block call's own spec (an edge context's FourierEmbedding),
 *            appended in order by qc_memspec_nest: replayed, but taken by the nested call from
 *            its own spec, so this spec's order check skips them.
 *
 * Invariants: every ALLOC event names a distinct tensor; a tensor's FREE follows its ALLOC in the
 * same spec, unless the tensor is home-held; after a replay every local tensor has been freed.
 */
#ifndef QC_MEM_QC_MEMSPEC_H
#define QC_MEM_QC_MEMSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qc_stash.h" /* struct qc_block_mem */
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QC_MEMSPEC_MAX 24 /* tensors of one call, nested calls included */
#define QC_MEMSPEC_IDS 16 /* ids a block file may use: 0 .. QC_MEMSPEC_IDS - 1 */

enum qc_memspec_flag {
    QC_MEMSPEC_ZERO = 1u,   /* zero-filled on the block's backend after allocation */
    QC_MEMSPEC_NESTED = 2u, /* taken by a nested call from its own spec */
    QC_MEMSPEC_HELD = 4u,   /* allocated by an earlier call, freed here (qc_memspec_free_home) */
};

enum qc_memspec_op { QC_MEMSPEC_ALLOC = 0, QC_MEMSPEC_FREE };

/* The pointer field that holds a tensor between calls (typed, so that no pointer is written
 * through another pointer type): at most one member set; none = local to the call. */
struct qc_memspec_home {
    float **f32;
    int64_t **i64;
};
#define QC_MEMSPEC_LOCAL       ((struct qc_memspec_home){NULL, NULL})
#define QC_MEMSPEC_HOME_F32(p) ((struct qc_memspec_home){(p), NULL})
#define QC_MEMSPEC_HOME_I64(p) ((struct qc_memspec_home){NULL, (p)})

struct qc_memspec_tensor {
    const struct qc_block_mem *bm; /* whose memory: tag prefix, context, backend */
    const char *name;              /* tag suffix (static storage) */
    size_t bytes;                  /* as asked (0 allocates 1 byte, as qc_block_alloc) */
    unsigned flags;                /* enum qc_memspec_flag */
    struct qc_memspec_home home;   /* outlives the call: its pointer field */
};

struct qc_memspec_event {
    uint8_t op; /* enum qc_memspec_op */
    uint8_t t;  /* tensor index */
};

struct qc_memspec {
    int nt, nev;
    struct qc_memspec_tensor t[QC_MEMSPEC_MAX];
    struct qc_memspec_event ev[2 * QC_MEMSPEC_MAX];
    int8_t id[QC_MEMSPEC_IDS]; /* id -> tensor index, -1 = absent */
    void *p[QC_MEMSPEC_MAX];   /* local tensors' memory while live */
    int cursor;                /* take: the next event the real code allocates */
};

// ---- filling a spec (the blocks' spec functions) -------------------------------------------

/* Empty spec: no tensor, every id absent. */
void qc_memspec_init(struct qc_memspec *s);
/* Appends tensor id (-1: no id) of bm, name, bytes, flags, home, and its ALLOC event. Aborts past
 * QC_MEMSPEC_MAX tensors or on an id given twice. */
void qc_memspec_alloc(struct qc_memspec *s, int id, const struct qc_block_mem *bm, const char *name,
                      size_t bytes, unsigned flags, struct qc_memspec_home home);
/* Appends the FREE event of tensor id (allocated earlier in this spec). */
void qc_memspec_free(struct qc_memspec *s, int id);
/* Appends tensor id, allocated by an earlier call and held at *home, and its FREE event. */
void qc_memspec_free_home(struct qc_memspec *s, int id, const struct qc_block_mem *bm,
                          const char *name, size_t bytes, struct qc_memspec_home home);
/* Appends the tensors and events of a nested call's spec (flagged QC_MEMSPEC_NESTED, no ids). */
void qc_memspec_nest(struct qc_memspec *s, const struct qc_memspec *sub);
/* Whether the spec holds tensor id. */
static inline bool qc_memspec_has(const struct qc_memspec *s, int id)
{
    return id >= 0 && id < QC_MEMSPEC_IDS && s->id[id] >= 0;
}
/* floats as bytes (n < 0 counts as 0). */
static inline size_t qc_memspec_floats(int64_t n)
{
    return (size_t)(n > 0 ? n : 0) * sizeof(float);
}

// ---- the real code: memory from the spec ----------------------------------------------------

/* Allocates tensor id (its bm, tag "<bm name>/<name>", bytes, zero-filled with QC_MEMSPEC_ZERO)
 * and sets its home; *out = the memory. A HELD tensor (allocated by an earlier call) is not
 * allocated again: *out = what its home holds. *out = NULL when id is absent from the spec (QC_OK).
 * Asserts that an allocated id is the spec's next ALLOC (nested tensors skipped). QC_ERR_NOMEM
 * naming the tag and the bytes (nothing allocated). */
enum qc_status qc_memspec_take(struct qc_memspec *s, int id, void **out);
/* The same for a float tensor. */
static inline enum qc_status qc_memspec_take_f32(struct qc_memspec *s, int id, float **out)
{
    void *p = NULL;
    const enum qc_status st = qc_memspec_take(s, id, &p);
    *out = p;
    return st;
}
/* Frees tensor id (its local memory, or *home, which becomes NULL); a no-op for an absent id or
 * a tensor not allocated. */
void qc_memspec_give(struct qc_memspec *s, int id);
/* Frees every local tensor still allocated (an error path), in reverse order of allocation. */
void qc_memspec_give_all(struct qc_memspec *s);

// ---- the dry run ------------------------------------------------------------------------------

/* Runs every event in order: the allocations through each tensor's memory context (the dry
 * context hands out addresses never dereferenced; ZERO touches nothing), the homes set and
 * taken as the real code does. QC_ERR_NOMEM (an injected failure): what the replay allocated
 * locally is given back. */
enum qc_status qc_memspec_replay(struct qc_memspec *s);

// ---- reading a spec ---------------------------------------------------------------------------

/* The largest sum of the call's local tensors alive at once (its transient working set). */
size_t qc_memspec_transient_peak(const struct qc_memspec *s);
/* Bytes of the tensors the call leaves allocated at their homes (Σ ALLOC − FREE of home-held). */
int64_t qc_memspec_home_delta(const struct qc_memspec *s);

#ifdef __cplusplus
}
#endif

#endif /* QC_MEM_QC_MEMSPEC_H */
