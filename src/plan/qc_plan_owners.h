/*
 * qc_plan_owners.h — who holds device bytes at a step's peak, and which setting moves them: one
 * table for `qctrain plan`'s explanation of its floor (the kinds of qc_plan_explain, its
 * "knobs") and the HTML report's breakdown of the measured peak step (src/report, which reads
 * the allocator's tags of that step's trace). Both name the same classes with the same words.
 *
 *   kind   enum qc_plan_hold (qc_plan.h): fixed, stash read, stash, tensor, working set,
 *          recompute; qc_plan_hold_key gives its JSON key, qc_plan_hold_knob what moves it;
 *   owner  a finer class of holder (enum qc_plan_owner): parameters, gradients, AdamW moments,
 *          the staged batch (all fixed), a block's stash, an edge set's r (a stash) and dL/dr (a
 *          tensor), activation gradients, other tensors, the working set of the op running at
 *          the peak, a recompute's scratch; each has a kind, whether a stash policy can move
 *          it, and its own knob;
 *   tag    an allocation's name "<block>/<tensor>" as the memory context records it (the
 *          allocator's tags, the plan program's tags): qc_plan_owner_of_tag reads one.
 * Pure data and string reading: no allocation, thread-safe.
 */
#ifndef QC_PLAN_QC_PLAN_OWNERS_H
#define QC_PLAN_QC_PLAN_OWNERS_H

#include <stdbool.h>
#include <stddef.h>

#include "qc_plan.h" /* enum qc_plan_hold */

#ifdef __cplusplus
extern "C" {
#endif

/* The JSON key of a kind: "fixed", "stash_read", "stash", "tensor", "working_set",
 * "recompute" ("?" out of range). */
const char *qc_plan_hold_key(enum qc_plan_hold k);
/* The settings that move the bytes of a kind (`qctrain plan`'s "what moves it"). */
const char *qc_plan_hold_knob(enum qc_plan_hold k);

enum qc_plan_owner {
    QC_PLAN_OWNER_PARAMS = 0, /* fixed: the parameters (tag block "params") */
    QC_PLAN_OWNER_GRADS,      /* fixed: the parameters' gradients ("grads") */
    QC_PLAN_OWNER_MOMENTS,    /* fixed: AdamW moments and the optimizer's arrays ("optim*") */
    QC_PLAN_OWNER_BATCH,      /* fixed: the staged batch ("batch*") */
    QC_PLAN_OWNER_STASH,      /* stash: a block application's stash (".../appN.stash",
                                 ".../stash", "<layer>/kv", "edges/<set>.fe") */
    QC_PLAN_OWNER_EDGE_R,     /* stash: the relative embeddings r of an edge set
                                 ("edges/<set>.r", materialised mode) */
    QC_PLAN_OWNER_EDGE_DR,    /* tensor: dL/dr of an edge set ("edges.<set>/edges.dr") */
    QC_PLAN_OWNER_ACT_GRAD,   /* tensor: activation gradients ("grad/<tensor>") */
    QC_PLAN_OWNER_TENSOR,     /* tensor: any other allocation live across blocks (outputs kept
                                 for a later block, the inputs built from the batch, a
                                 context's index arrays) */
    QC_PLAN_OWNER_WORKING,    /* working set: the op running at the peak (its own tensors and
                                 scratch), and the shared scratch ("scratch*") */
    QC_PLAN_OWNER_RECOMPUTE,  /* recompute: a recompute's scratch and output */
    QC_PLAN_OWNER_COUNT
};

struct qc_plan_owner_info {
    const char *key;        /* JSON key: "parameters", "edge_r", ... */
    const char *label;      /* for people: "parameters", "r of an edge set", ... */
    enum qc_plan_hold kind; /* its kind (a stash of the block running at the peak is read
                               there: QC_PLAN_HOLD_STASH_READ, which no policy moves) */
    bool movable;           /* a stash policy (offload, recompute) can move it */
    const char *knob;       /* what moves it: plan.*, offload.*, model.*, train.*, dist.* */
};

/* The row of owner o (NULL out of range). */
const struct qc_plan_owner_info *qc_plan_owner_info(enum qc_plan_owner o);

/* The owner of an allocation tag, and the holder's name into name (n bytes, NUL-terminated):
 * "parameters", "gradients", "AdamW moments", "staged batch", "stash of <block application>"
 * (the name `qctrain plan` gives it), "r of edge set <set>", "dL/dr of edge set <set>", or the
 * tag itself (activation gradients, tensors, scratch). A tag cut by the allocator (63 bytes)
 * whose end is a prefix of ".stash" or "/stash" reads as a stash. An empty tag is a tensor
 * named "(untagged)". Whether a tensor is the working set of the op at the peak is the
 * caller's to say (it knows that op): this returns QC_PLAN_OWNER_WORKING for "scratch*" only. */
enum qc_plan_owner qc_plan_owner_of_tag(const char *tag, char *name, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* QC_PLAN_QC_PLAN_OWNERS_H */
