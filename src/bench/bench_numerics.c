/*
 * bench_numerics.c — `qctrain bench numerics [--data FILE...] [--scenes N] [--out DIR]`: how far
 * qctrain's fp32 forward and loss lie from float64 (issue 29, docs/NUMERICS.md).
 *
 * It writes a case folder in the layout of tests/data/qcnet-parity-tiny — batch.safetensors (the
 * collated scenes under QCNet's field names), weights.safetensors (the model of the
 * configuration, initialised from train.seed), manifest.json (the model configuration) — and
 * qctrain.safetensors: this build's outputs (pred.*, enc.*, loss.*, CPU backend, eval mode, the
 * ops rounding to train.precision: fp32 by default; bf16 / fp16 show what 16 bits cost)
 * and the edge_index every attention layer saw (edge_index.<layer>.call0, official order). Then
 * it runs tools/qcnet_f64.py on the folder, an independent NumPy implementation of the official
 * model, which computes the same forward in float64 and in float32 and prints, per output, the
 * distance from float64 of qctrain's fp32 and of a plain fp32 implementation (NumPy: OpenBLAS
 * GEMMs, pairwise sums). Figures only: it gates nothing.
 *
 * Scenes: the first --scenes of the --data files, else --scenes synthetic ones of the
 * configuration's profile (data.synthetic_profile, seeded by train.seed). --seeds N writes N
 * cases (folders seed-<s>, weights initialised from train.seed + 0 .. N-1, the same scenes): one
 * case's distances depend on which few elements happen to round badly (a loss 10 ulps off in
 * one case, 0.2 in the next), so the tool then prints medians over the cases.
 */
#include "qc_cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qc_batch.h"
#include "qc_exec.h"
#include "qc_file.h"
#include "qc_graph.h"
#include "qc_qcnet.h"
#include "qc_qcshard.h"
#include "qc_safetensors.h"
#include "qc_synth.h"
#include "qc_train.h"

static const char numerics_usage[] =
    "[--data FILE...] [--scenes N] [--seeds N] [--attention NAME] [--out DIR]";
static const char numerics_summary[] =
    "fp32 forward and loss against float64: writes a case folder (batch, weights, this build's "
    "outputs and edge sets) and runs tools/qcnet_f64.py on it (python3 with NumPy), which prints "
    "each output's distance from float64 for qctrain and for a plain fp32 implementation.";

/* The scenes of the case: the first n of the files, or n synthetic ones. */
struct nm_scenes {
    struct qc_scene *v;
    int64_t n;
    struct qc_qcshard_reader **readers;
    int nreaders;
};

static void nm_scenes_free(struct nm_scenes *s)
{
    for (int64_t i = 0; i < s->n; i++)
        qc_scene_free(&s->v[i]);
    for (int i = 0; i < s->nreaders; i++)
        qc_qcshard_reader_destroy(s->readers[i]);
    free(s->v);
    free(s->readers);
    memset(s, 0, sizeof *s);
}

static enum qc_status nm_scenes_load(const struct qc_cli_strings *data, const struct qc_config *cfg,
                                     int64_t n, struct nm_scenes *s)
{
    s->v = calloc((size_t)n, sizeof *s->v);
    s->readers = calloc((size_t)(data->n ? data->n : 1), sizeof *s->readers);
    if (!s->v || !s->readers)
        return qc_errorf(QC_ERR_NOMEM, "bench numerics: out of memory");
    if (data->n == 0) {
        for (; s->n < n; s->n++)
            QC_TRY(qc_synth_scene((uint64_t)cfg->seed, s->n,
                                  (enum qc_synth_profile)cfg->synthetic_profile, &s->v[s->n]));
        return QC_OK;
    }
    for (int f = 0; f < data->n && s->n < n; f++) {
        QC_TRY(qc_qcshard_reader_create(data->v[f], &s->readers[s->nreaders]));
        struct qc_qcshard_reader *r = s->readers[s->nreaders++];
        for (int64_t i = 0; i < qc_qcshard_reader_count(r) && s->n < n; i++, s->n++)
            QC_TRY(qc_qcshard_reader_scene(r, i, &s->v[s->n]));
    }
    if (s->n < n)
        return qc_errorf(QC_ERR_INVALID,
                         "bench numerics: --scenes %" PRId64 ", but the files hold %" PRId64, n,
                         s->n);
    return QC_OK;
}

// ---- the case folder --------------------------------------------------------------------------

/* batch.safetensors: the fields tools/qcnet_f64.py reads, under QCNet's collated names. */
static enum qc_status nm_write_batch(const struct qc_batch *b, const char *path)
{
    struct qc_st_writer *w = NULL;
    QC_TRY(qc_st_writer_create(&w));
    const int64_t A = b->num_agents, P = b->num_polygons, Pt = b->num_points, E = b->num_pl2pl;
    const int64_t a110[] = {A, 110}, a3[] = {A, 110, 3}, a1[] = {A}, tg[] = {A, 60, 4};
    const int64_t p3[] = {P, 3}, p1[] = {P}, q3[] = {Pt, 3}, q1[] = {Pt}, q2[] = {2, Pt};
    const int64_t e2[] = {2, E}, e1[] = {E};
    enum qc_status st = QC_OK;
#define ADD(name, dtype, ndim, shape, data)                                                        \
    if (st == QC_OK)                                                                               \
    st = qc_st_writer_add(w, name, dtype, ndim, shape, data)
    ADD("agent.valid_mask", QC_ST_U8, 2, a110, b->valid_mask);
    ADD("agent.predict_mask", QC_ST_U8, 2, a110, b->predict_mask);
    ADD("agent.type", QC_ST_U8, 1, a1, b->agent_type);
    ADD("agent.position", QC_ST_F32, 3, a3, b->position);
    ADD("agent.heading", QC_ST_F32, 2, a110, b->heading);
    ADD("agent.velocity", QC_ST_F32, 3, a3, b->velocity);
    ADD("agent.target", QC_ST_F32, 3, tg, b->target);
    ADD("map_polygon.position", QC_ST_F32, 2, p3, b->pl_position);
    ADD("map_polygon.orientation", QC_ST_F32, 1, p1, b->pl_orientation);
    ADD("map_polygon.type", QC_ST_U8, 1, p1, b->pl_type);
    ADD("map_polygon.is_intersection", QC_ST_U8, 1, p1, b->pl_is_intersection);
    ADD("map_point.position", QC_ST_F32, 2, q3, b->pt_position);
    ADD("map_point.orientation", QC_ST_F32, 1, q1, b->pt_orientation);
    ADD("map_point.magnitude", QC_ST_F32, 1, q1, b->pt_magnitude);
    ADD("map_point.type", QC_ST_U8, 1, q1, b->pt_type);
    ADD("map_point.side", QC_ST_U8, 1, q1, b->pt_side);
    ADD("map_point__to__map_polygon.edge_index", QC_ST_I64, 2, q2, b->pt2pl);
    ADD("map_polygon__to__map_polygon.edge_index", QC_ST_I64, 2, e2, b->pl2pl_edge);
    ADD("map_polygon__to__map_polygon.type", QC_ST_U8, 1, e1, b->pl2pl_type);
#undef ADD
    if (st == QC_OK)
        st = qc_st_writer_write(w, path);
    qc_st_writer_destroy(w);
    return st;
}

/* The official module name of edge set s's layer l (stage: the decoder's "propose" or "refine"). */
static void nm_layer_name(enum qc_edge_set s, int64_t l, bool refine, char *buf, size_t cap)
{
    static const char *const base[QC_EDGE_SET_COUNT] = {
        [QC_EDGE_PT2PL] = "encoder.map_encoder.pt2pl_layers",
        [QC_EDGE_PL2PL] = "encoder.map_encoder.pl2pl_layers",
        [QC_EDGE_T] = "encoder.agent_encoder.t_attn_layers",
        [QC_EDGE_PL2A] = "encoder.agent_encoder.pl2a_attn_layers",
        [QC_EDGE_A2A] = "encoder.agent_encoder.a2a_attn_layers",
        [QC_EDGE_T2M] = "t2m",
        [QC_EDGE_PL2M] = "pl2m",
        [QC_EDGE_A2M] = "a2m",
        [QC_EDGE_M2M] = "m2m",
    };
    const char *stage = refine ? "refine" : "propose";
    if (s == QC_EDGE_M2M)
        snprintf(buf, cap, "decoder.m2m_%s_attn_layer", stage);
    else if (s >= QC_EDGE_T2M)
        snprintf(buf, cap, "decoder.%s_%s_attn_layers.%" PRId64, base[s], stage, l);
    else
        snprintf(buf, cap, "%s.%" PRId64, base[s], l);
}

/* dir/name into buf; QC_ERR_INVALID when it does not fit. */
static enum qc_status nm_path(char *buf, size_t cap, const char *dir, const char *name)
{
    const int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return qc_errorf(QC_ERR_INVALID, "bench numerics: the path %s/%s is too long", dir, name);
    return QC_OK;
}

/* qctrain.safetensors: the fp32 outputs, every layer's edge_index and each positional edge set's
 * raw relative features (edge_attr.<set>, per layer edge in the official order: the inputs of
 * its FourierEmbedding, which tools/qcnet_f64.py computes itself and compares). */
static enum qc_status nm_write_outputs(const struct qc_qcnet_config *mc, const struct qc_batch *b,
                                       const struct qc_qcnet_output *o,
                                       const struct qc_qcnet_loss *loss, const char *path)
{
    struct qc_st_writer *w = NULL;
    QC_TRY(qc_st_writer_create(&w));
    const struct qc_graph *g = &b->graph;
    const int64_t pred[] = {o->A, o->K, o->S, 2}, pi[] = {o->A, o->K};
    const int64_t xpt[] = {o->Pt, o->D}, xpl[] = {o->P, o->D}, xa[] = {o->A, 50, o->D};
    int64_t *ei[QC_EDGE_SET_COUNT] = {0}, *base = NULL;
    float *attr[QC_EDGE_SET_COUNT] = {0};
    enum qc_status st = QC_OK;
    for (int s = 0; s < QC_EDGE_SET_COUNT && st == QC_OK; s++) {
        const int64_t E = qc_graph_layer_num_edges(g, (enum qc_edge_set)s);
        const int nf = g->e[s].num_feat;
        free(base);
        ei[s] = malloc((size_t)(2 * E + 2) * sizeof(int64_t));
        base = malloc((size_t)(E + 1) * sizeof(int64_t));
        attr[s] = malloc((size_t)(E * nf + 1) * sizeof(float));
        if (!ei[s] || !base || !attr[s]) {
            st = qc_errorf(QC_ERR_NOMEM, "bench numerics: out of memory");
            break;
        }
        qc_graph_layer_official(g, (enum qc_edge_set)s, ei[s], base);
        /* the raw relative features of each layer edge (its base edge's), official order */
        for (int64_t j = 0; j < E; j++)
            for (int f = 0; f < nf; f++)
                attr[s][j * nf + f] = g->e[s].attr[base[j] * nf + f];
        if (nf > 0) {
            char name[64];
            snprintf(name, sizeof name, "edge_attr.%s", qc_edge_set_name((enum qc_edge_set)s));
            const int64_t ashape[] = {E, nf};
            st = qc_st_writer_add(w, name, QC_ST_F32, 2, ashape, attr[s]);
        }
        const int64_t shape[] = {2, E};
        const int64_t layers = s <= QC_EDGE_PL2PL ? mc->num_map_layers
                               : s <= QC_EDGE_A2A ? mc->num_agent_layers
                               : s == QC_EDGE_M2M ? 1
                                                  : mc->num_dec_layers;
        for (int64_t l = 0; l < layers && st == QC_OK; l++)
            for (int stage = 0; stage < (s >= QC_EDGE_T2M ? 2 : 1) && st == QC_OK; stage++) {
                char layer[128], name[160];
                nm_layer_name((enum qc_edge_set)s, l, stage == 1, layer, sizeof layer);
                snprintf(name, sizeof name, "edge_index.%s.call0", layer);
                st = qc_st_writer_add(w, name, QC_ST_I64, 2, shape, ei[s]);
            }
    }
    const struct {
        const char *name;
        int ndim;
        const int64_t *shape;
        const float *data;
    } t[] = {
        {"pred.loc_propose_pos", 4, pred, o->loc_propose_pos},
        {"pred.scale_propose_pos", 4, pred, o->scale_propose_pos},
        {"pred.loc_refine_pos", 4, pred, o->loc_refine_pos},
        {"pred.scale_refine_pos", 4, pred, o->scale_refine_pos},
        {"pred.pi", 2, pi, o->pi},
        {"enc.x_pt", 2, xpt, o->x_pt},
        {"enc.x_pl_last", 2, xpl, o->x_pl},
        {"enc.x_a", 3, xa, o->x_a},
        {"loss.loss", 0, NULL, &loss->loss},
        {"loss.reg_loss_propose", 0, NULL, &loss->reg_loss_propose},
        {"loss.reg_loss_refine", 0, NULL, &loss->reg_loss_refine},
        {"loss.cls_loss", 0, NULL, &loss->cls_loss},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0] && st == QC_OK; i++)
        st = qc_st_writer_add(w, t[i].name, QC_ST_F32, t[i].ndim, t[i].shape, t[i].data);
    const int64_t bm[] = {loss->num_agents};
    if (st == QC_OK)
        st = qc_st_writer_add(w, "loss.best_mode", QC_ST_I64, 1, bm, loss->best_mode);
    if (st == QC_OK)
        st = qc_st_writer_write(w, path);
    qc_st_writer_destroy(w);
    for (int s = 0; s < QC_EDGE_SET_COUNT; s++) {
        free(ei[s]);
        free(attr[s]);
    }
    free(base);
    return st;
}

static enum qc_status nm_write_manifest(const struct qc_config *c, const struct qc_qcnet_config *mc,
                                        const char *path)
{
    char cfg[4096];
    struct qc_qcnet_official off;
    qc_train_official_args(c, &off);
    qc_qcnet_config_json_official(mc, &off, cfg, sizeof cfg);
    char text[4400];
    const int n = snprintf(text, sizeof text,
                           "{\"producer\": \"qctrain bench numerics\", \"config\": %s}\n", cfg);
    const struct qc_file_part part = {text, (size_t)n};
    return qc_file_write_atomic(path, &part, 1, "numerics case manifest");
}

/* Writes the case into dir: forward and loss of the model initialised from seed, on the scenes. */
static enum qc_status nm_write_case(const struct qc_config *cfg, const struct nm_scenes *sc,
                                    uint64_t seed, const char *dir)
{
    struct qc_qcnet_config mc;
    qc_train_model_config(cfg, &mc);
    /* the ops round to train.precision as a training run's do (docs/PRECISION.md) */
    const struct qc_exec ex = {.backend = QC_EXEC_CPU, .precision = mc.precision};
    const struct qc_scene **ptrs = malloc((size_t)sc->n * sizeof *ptrs);
    if (!ptrs)
        return qc_errorf(QC_ERR_NOMEM, "bench numerics: out of memory");
    for (int64_t i = 0; i < sc->n; i++)
        ptrs[i] = &sc->v[i];
    struct qc_batch batch;
    enum qc_status st = qc_batch_collate(ptrs, sc->n, NULL, true, &batch);
    free(ptrs);
    QC_TRY(st);
    struct qc_graph_builder *gb = NULL;
    struct qc_graph_params gp;
    qc_train_graph_params(cfg, &gp);
    st = qc_graph_builder_create(&gb);
    if (st == QC_OK)
        st = qc_batch_build_graph(&batch, gb, &gp);
    qc_graph_builder_destroy(gb);
    struct qc_qcnet *m = NULL;
    if (st == QC_OK)
        st = qc_qcnet_create_on(&mc, NULL, &ex, &m);
    char path[4200];
    if (st == QC_OK) {
        qc_qcnet_init_params(m, seed);
        st = nm_path(path, sizeof path, dir, "weights.safetensors");
    }
    if (st == QC_OK)
        st = qc_qcnet_save(m, path);
    struct qc_qcnet_ctx ctx = {.training = false, .need_backward = false, .seed = 1};
    struct qc_qcnet_output o;
    struct qc_qcnet_loss loss;
    if (st == QC_OK)
        st = qc_qcnet_forward(m, &batch, &ctx, &o);
    if (st == QC_OK)
        st = qc_qcnet_loss(m, &loss);
    if (st == QC_OK)
        st = nm_path(path, sizeof path, dir, "qctrain.safetensors");
    if (st == QC_OK)
        st = nm_write_outputs(&mc, &batch, &o, &loss, path);
    if (st == QC_OK)
        st = nm_path(path, sizeof path, dir, "batch.safetensors");
    if (st == QC_OK)
        st = nm_write_batch(&batch, path);
    if (st == QC_OK)
        st = nm_path(path, sizeof path, dir, "manifest.json");
    if (st == QC_OK)
        st = nm_write_manifest(cfg, &mc, path);
    if (m)
        qc_qcnet_release(m);
    qc_qcnet_destroy(m);
    qc_batch_release(&batch);
    return st;
}

/* The case folders: dir/seed-<s> for s = seed0 .. seed0 + n - 1. */
#define NM_MAX_SEEDS 12

static enum qc_status nm_case_dir(char *buf, size_t cap, const char *dir, int64_t seed)
{
    char name[32];
    snprintf(name, sizeof name, "seed-%" PRId64, seed);
    return nm_path(buf, cap, dir, name);
}

/* Removes what nm_write_case wrote into the n case folders, the folders and dir. */
static void nm_remove_cases(const char *dir, int64_t seed0, int64_t n)
{
    static const char *const files[] = {"batch.safetensors", "weights.safetensors",
                                        "qctrain.safetensors", "manifest.json"};
    char sub[4200], path[4300];
    for (int64_t i = 0; i < n; i++) {
        if (nm_case_dir(sub, sizeof sub, dir, seed0 + i) != QC_OK)
            continue;
        for (size_t f = 0; f < sizeof files / sizeof files[0]; f++)
            if (nm_path(path, sizeof path, sub, files[f]) == QC_OK)
                unlink(path);
        rmdir(sub);
    }
    rmdir(dir);
}

enum qc_status qc_bench_numerics(struct qc_cli *cli, int argc, char **argv)
{
    struct qc_cli_strings data = {0};
    int64_t scenes = 1, seeds = 1;
    const char *out = NULL, *attention = NULL;
    const struct qc_cli_opt opts[] = {
        {"data", QC_CLI_STRINGS, &data, "", "qcshard file(s): their first --scenes scenes"},
        {"scenes", QC_CLI_INT, &scenes, "1",
         "scenes in the batch (from --data, else synthetic of data.synthetic_profile)"},
        {"seeds", QC_CLI_INT, &seeds, "1",
         "cases, the weights of each initialised from train.seed + 0 .. N-1 (at most 12): the "
         "figures are then medians over them"},
        {"attention", QC_CLI_STRING, &attention, "model.attention", "fused or unfused"},
        {"out", QC_CLI_STRING, &out, "a temporary folder, removed after",
         "keep the case folders here (OUT/seed-<s>; OUT is created and must not exist)"},
    };
    const char *pos[QC_CLI_STRINGS_MAX];
    int npos = 0;
    bool help = false;
    QC_TRY(qc_cli_parse("bench numerics", numerics_usage, numerics_summary, opts,
                        (int)(sizeof opts / sizeof opts[0]), argc, argv, pos, QC_CLI_STRINGS_MAX,
                        &npos, &help));
    if (help)
        return QC_OK;
    struct qc_config cfg = cli->cfg;
    QC_TRY(qc_train_cli_finish("bench numerics", pos, npos, &data, attention, &cfg));
    if (scenes < 1 || scenes > 64)
        return qc_errorf(QC_ERR_INVALID, "bench numerics: --scenes %" PRId64 " (1 .. 64)", scenes);
    if (seeds < 1 || seeds > NM_MAX_SEEDS)
        return qc_errorf(QC_ERR_INVALID, "bench numerics: --seeds %" PRId64 " (1 .. %d)", seeds,
                         NM_MAX_SEEDS);
    if (cli->cfg.device_kind != QC_CONFIG_DEVICE_CPU)
        return qc_errorf(QC_ERR_INVALID, "bench numerics: runs on the CPU backend (--device cpu)");
    char dir[4096];
    if (out && strlen(out) >= sizeof dir)
        return qc_errorf(QC_ERR_INVALID, "bench numerics --out: the path is too long");
    if (out) {
        if (mkdir(out, 0755) != 0)
            return qc_errorf(QC_ERR_INVALID,
                             "bench numerics --out %s: cannot create the folder: %s", out,
                             strerror(errno));
        snprintf(dir, sizeof dir, "%s", out);
    } else {
        snprintf(dir, sizeof dir, "/tmp/qctrain-numerics-XXXXXX");
        if (!mkdtemp(dir))
            return qc_errorf(QC_ERR_IO, "bench numerics: cannot create a folder in /tmp: %s",
                             strerror(errno));
    }
    struct nm_scenes sc = {0};
    enum qc_status st = nm_scenes_load(&data, &cfg, scenes, &sc);
    char subs[NM_MAX_SEEDS][4200];
    const char *args[NM_MAX_SEEDS + 2];
    int64_t made = 0;
    for (; made < seeds && st == QC_OK; made++) {
        const int64_t seed = cfg.seed + made;
        st = nm_case_dir(subs[made], sizeof subs[made], dir, seed);
        if (st == QC_OK && mkdir(subs[made], 0755) != 0)
            st = qc_errorf(QC_ERR_IO, "bench numerics: cannot create %s: %s", subs[made],
                           strerror(errno));
        if (st == QC_OK)
            st = nm_write_case(&cfg, &sc, (uint64_t)seed, subs[made]);
        args[made] = subs[made];
    }
    nm_scenes_free(&sc);
    if (st == QC_OK) {
        if (!cli->quiet)
            printf("bench numerics: %" PRId64 " scene(s), %" PRId64 " seed(s) from %" PRId64
                   ", %s attention, %s, cases in %s%s\n",
                   scenes, seeds, cfg.seed,
                   cfg.attention == QC_ATTENTION_FUSED ? "fused" : "unfused",
                   qc_precision_str(cfg.precision), dir, out ? "" : " (removed after)");
        args[made] = "--ours";
        args[made + 1] = "qctrain.safetensors";
        st = qc_cli_tool_run("bench numerics", "qcnet_f64.py", args, (int)made + 2);
    }
    if (!out)
        nm_remove_cases(dir, cfg.seed, made);
    return st;
}
