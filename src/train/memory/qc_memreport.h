/*
 * qc_memreport.h — the memory report a training run writes: RUN/memory.json (every figure, for
 * tools) and RUN/memory.txt (the short human version, what a user reads first). Both are
 * written atomically (temp file + fsync + rename + fsync of the folder) at every checkpoint and
 * at the end of `qctrain train`; docs/MEMORY_REPORT.md documents every field and unit.
 *
 * What it holds: the allocator's run-wide statistics (every field of struct qc_alloc_stats,
 * peaks since the allocator was created), the budget, params+grads bytes, the peak RSS, the
 * per-step series (step, allocated peak, reserved peak of each step), the breakdown of the
 * live bytes at the run's peak by tag and by block (the allocator's run-wide peak snapshot,
 * taken within 1 % below the true peak: qc_alloc.h), the planner's plan of the step with the
 * highest measured peak (policy, stash bytes and predicted time per block application), and for
 * a data-parallel run each rank's bytes of parameters, gradients, AdamW moments and
 * communication buffers (rank 0 writes the report; the rest of it is rank 0's own figures; the
 * text's headline is the largest rank's peak), and for a run that stopped early (an error, a
 * signal) why: the error, the step (with several ranks: which rank failed, with its error). A
 * run that fails writes it too (qc_trainer_run; several ranks: a failure agreed in a step).
 */
#ifndef QC_MEMORY_QC_MEMREPORT_H
#define QC_MEMORY_QC_MEMREPORT_H

#include <stddef.h>
#include <stdint.h>

#include "qc_alloc.h" /* struct qc_alloc_stats, struct qc_alloc_peak_snapshot */
#include "qc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One optimizer step's memory: the allocator's step window (reset at the step's start). */
struct qc_memreport_step {
    int64_t step;                  /* optimizer steps done after it (1 for the first) */
    uint64_t bytes_allocated_peak; /* allocated peak during the step, bytes */
    uint64_t bytes_reserved_peak;  /* reserved peak during the step, bytes */
};

/* One block application of the plan memory.json shows. */
struct qc_memreport_plan_block {
    char name[128];          /* the application ("ref/a2a/l0", "gru", ...) */
    const char *policy;      /* "keep" | "offload_host" | "offload_nvme" | "recompute" */
    uint64_t bytes;          /* its stash, bytes */
    double predicted_time_s; /* predicted forward + backward, with what the policy adds */
};

/* The plan (src/plan) of the step with the highest measured peak. */
struct qc_memreport_plan {
    int64_t step;                                 /* the step it ran in */
    uint64_t predicted_peak_bytes;                /* the planner's peak for it */
    uint64_t measured_peak_bytes;                 /* the allocator's active peak of the step */
    const struct qc_memreport_plan_block *blocks; /* [nblocks], in forward order */
    int32_t nblocks;
};

/* One rank's share of a data-parallel run (sharded data parallelism, src/dist). */
struct qc_memreport_rank {
    int64_t rank;
    uint64_t params_bytes;        /* the flat parameters (whole on every rank) */
    uint64_t grads_bytes;         /* the flat gradient buffer backward accumulates into */
    uint64_t grads_reduced_bytes; /* of which reduced and kept: all below stage 2, the shard at 2 */
    uint64_t moments_bytes;       /* AdamW exp_avg + exp_avg_sq: whole, or the shard (stage >= 1) */
    uint64_t comm_bytes;          /* the communication thread's receive buffers (high water) */
    uint64_t peak_allocated_bytes; /* the rank's allocator peak over the run */
};

/* Why a run stopped before its last step (memory.json "stopped"). */
struct qc_memreport_stop {
    const char *reason;  /* "error", "SIGINT" or "SIGTERM" */
    const char *message; /* the error as qctrain prints it (names the scene and the budget it
                            needs when one does not fit); "" for a signal */
    int64_t step;        /* the step it stopped in (error) or after (signal) */
    /* several ranks (world > 1), an error: the rank whose error message is (the first in rank
     * order that failed; a peer that went away; -1: no one rank, e.g. ranks hung in different
     * collectives), how many failed, of how many */
    int rank, failed_ranks, world;
};

/* Everything one report shows; the pointers are borrowed for the call. */
struct qc_memreport {
    const char *device;                    /* "cpu" / "cuda" */
    int64_t step;                          /* optimizer steps done when written */
    int64_t total_steps;                   /* steps the run goes to */
    struct qc_alloc_stats stats;           /* run-wide (qc_alloc_stats_get_run) */
    struct qc_alloc_peak_snapshot peak;    /* run-wide peak snapshot */
    uint64_t bytes_params_grads;           /* parameters + gradients (model buffers) */
    uint64_t bytes_peak_rss;               /* peak resident set of the process */
    const struct qc_memreport_step *steps; /* [nsteps], the steps this process ran */
    int64_t nsteps;
    const struct qc_memreport_plan *plan; /* NULL: no plan recorded (no "plan" object) */
    /* data-parallel runs only (nranks 0 otherwise: the "dist" object is left out) */
    int64_t zero_stage;
    const struct qc_memreport_rank *ranks; /* [nranks], in rank order */
    int64_t nranks;
    const struct qc_memreport_stop *stopped; /* NULL: the run did not stop early */
};

/* The per-step series a run collects for the report (qc_memreport.steps / nsteps).
 * Zero-initialise; qc_memreport_series_free frees. */
struct qc_memreport_series {
    struct qc_memreport_step *steps; /* [n] in the order added */
    int64_t n, cap;
};
/* Appends one step (the array grows by doubling). QC_ERR_NOMEM (the series unchanged). */
enum qc_status qc_memreport_series_add(struct qc_memreport_series *s,
                                       const struct qc_memreport_step *step);
void qc_memreport_series_free(struct qc_memreport_series *s);

/* Fills r's allocator part from a: run-wide statistics and the run-wide peak snapshot. */
void qc_memreport_from_alloc(struct qc_alloc *a, struct qc_memreport *r);

/* The memory.json document (pretty-printed, ends with a newline) into buf (always
 * NUL-terminated when cap > 0, truncated to cap). Returns the length it needed. */
size_t qc_memreport_format_json(const struct qc_memreport *r, char *buf, size_t cap);
/* The memory.txt text: peak allocated vs reserved vs budget, fragmentation, the step of the
 * peak, the top 10 blocks at the peak with bytes and share. Same buffer contract. */
size_t qc_memreport_format_text(const struct qc_memreport *r, char *buf, size_t cap);

/* Writes DIR/memory.json and DIR/memory.txt atomically (json first). The path of memory.txt
 * goes to txt_path (n bytes) when non-NULL. QC_ERR_IO naming the file (folder missing, disk
 * full); a failed write leaves the previous files in place and no temporary behind.
 * QC_ERR_NOMEM. */
enum qc_status qc_memreport_write(const char *dir, const struct qc_memreport *r, char *txt_path,
                                  size_t n);

struct qc_trainer;
/* Writes the run's memory report now (RUN/memory.json, RUN/memory.txt) from the trainer's
 * allocator, model and per-step series; qc_trainer_run calls it at every checkpoint and at the
 * end. txt_path as above. */
enum qc_status qc_trainer_memory_report(struct qc_trainer *t, char *txt_path, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* QC_MEMORY_QC_MEMREPORT_H */
