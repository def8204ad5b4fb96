/*
 * test_config.c — the option table, presets and their error messages, sizes.
 *
 * Presets written by the tests go to a fresh folder under /tmp; QC_PROFILES_DIR points there
 * for the tests that look names up. The shipped presets are read from QC_SOURCE_DIR/profiles.
 */
#include <cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qc_cli.h"
#include "qc_config.h"
#include "qc_edit_distance.h"
#include "testutil.h"

static char tmp_dir[256];

static void write_file(const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        T_FATAL("cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* tmp_dir/name, in a static buffer (one at a time). */
static const char *tmp_path(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    return path;
}

/* Applies preset text written to tmp_dir/name; returns the status, cfg from defaults. */
static enum qc_status apply_text(struct qc_config *cfg, const char *name, const char *text)
{
    write_file(name, text);
    qc_config_defaults(cfg);
    qc_error_clear();
    return qc_config_apply_preset(cfg, tmp_path(name));
}

/* Expects apply_text to fail with exactly "<tmp_dir>/<name>: <rest>". */
static void expect_file_error(const char *name, const char *text, const char *rest)
{
    struct qc_config cfg;
    enum qc_status st = apply_text(&cfg, name, text);
    char want[2048];
    snprintf(want, sizeof want, "%s: %s", tmp_path(name), rest);
    T_EXPECT(st == QC_ERR_INVALID, "%s: status %d", name, (int)st);
    T_EXPECT(strcmp(qc_error_last(), want) == 0, "%s:\n      got  [%s]\n      want [%s]", name,
             qc_error_last(), want);
}

static void expect_set_error(const char *kv, const char *want)
{
    struct qc_config cfg;
    qc_config_defaults(&cfg);
    enum qc_status st = qc_config_apply_set(&cfg, kv);
    T_EXPECT(st == QC_ERR_INVALID, "--set %s: status %d", kv, (int)st);
    T_EXPECT(strcmp(qc_error_last(), want) == 0, "--set %s:\n      got  [%s]\n      want [%s]", kv,
             qc_error_last(), want);
}

static void expect_validate_error(const char *kv1, const char *kv2, const char *want_prefix)
{
    struct qc_config cfg;
    qc_config_defaults(&cfg);
    T_EXPECT(qc_config_apply_set(&cfg, kv1) == QC_OK, "%s: %s", kv1, qc_error_last());
    if (kv2)
        T_EXPECT(qc_config_apply_set(&cfg, kv2) == QC_OK, "%s: %s", kv2, qc_error_last());
    T_EXPECT(qc_config_validate(&cfg) == QC_ERR_INVALID, "%s %s should not validate", kv1,
             kv2 ? kv2 : "");
    T_EXPECT(strncmp(qc_error_last(), want_prefix, strlen(want_prefix)) == 0,
             "got [%s] want prefix [%s]", qc_error_last(), want_prefix);
}

static char *dump(const struct qc_config *cfg)
{
    char *s = NULL;
    if (qc_config_to_json(cfg, &s) != QC_OK)
        T_FATAL("dump: %s", qc_error_last());
    return s;
}

static const char *value_of(const struct qc_config *cfg, const char *key)
{
    static char buf[QC_CONFIG_STR_MAX + 32];
    const struct qc_config_option *o = qc_config_option_find(key);
    if (!o)
        return "(no such key)";
    qc_config_format_value(cfg, o, buf, sizeof buf);
    return buf;
}

/* The keys the issue names, in the groups it names them. */
static const char *const required_keys[] = {"model.hidden_dim",
                                            "model.num_heads",
                                            "model.head_dim",
                                            "model.num_freq_bands",
                                            "model.num_historical_steps",
                                            "model.num_future_steps",
                                            "model.num_modes",
                                            "model.num_recurrent_steps",
                                            "model.num_map_layers",
                                            "model.num_agent_layers",
                                            "model.num_dec_layers",
                                            "model.time_span",
                                            "model.num_t2m_steps",
                                            "model.max_num_neighbors",
                                            "model.dropout",
                                            "model.pl2pl_radius",
                                            "model.pl2a_radius",
                                            "model.a2a_radius",
                                            "model.pl2m_radius",
                                            "model.a2m_radius",
                                            "model.attention",
                                            "model.edge_mode",
                                            "train.lr",
                                            "train.weight_decay",
                                            "train.t_max",
                                            "train.epochs",
                                            "train.steps",
                                            "train.batch_size",
                                            "train.grad_accum",
                                            "train.global_batch",
                                            "train.seed",
                                            "train.save_every",
                                            "train.keep_last",
                                            "train.keep_best",
                                            "train.keep_best_metric",
                                            "train.log_every",
                                            "train.out_dir",
                                            "train.nonfinite",
                                            "train.max_skipped",
                                            "train.precision",
                                            "train.loss_scale_window",
                                            "train.cpu_threads",
                                            "data.synthetic_profile",
                                            "data.synthetic_scenes",
                                            "data.loader_threads",
                                            "data.prefetch_batches",
                                            "data.shuffle",
                                            "data.balance",
                                            "device.kind",
                                            "device.ordinal",
                                            "device.budget",
                                            "device.tf32",
                                            "alloc.expandable_segments",
                                            "alloc.round",
                                            "alloc.small_max",
                                            "alloc.small_segment",
                                            "alloc.large_segment",
                                            "alloc.split_limit",
                                            "alloc.by_lifetime",
                                            "alloc.trace",
                                            "alloc.trace_file",
                                            "alloc.trace_every",
                                            "alloc.trace_max_bytes",
                                            "offload.placement",
                                            "offload.host_capacity",
                                            "offload.nvme_dir",
                                            "offload.nvme_capacity",
                                            "offload.queue_depth",
                                            "offload.block_size",
                                            "offload.max_inflight",
                                            "offload.direct",
                                            "offload.prefetch_window",
                                            "hw.pcie_gbps",
                                            "hw.nvme_gbps",
                                            "hw.gpus_per_node",
                                            "hw.device_memory",
                                            "hw.device_reserve",
                                            "hw.tflops",
                                            "hw.mem_gbps",
                                            "dist.world_size",
                                            "dist.zero_stage",
                                            "dist.bucket_bytes",
                                            "dist.timeout",
                                            "plan.policy",
                                            "plan.margin",
                                            "plan.calibration",
                                            "log.level",
                                            "log.quiet",
                                            "log.tensorboard",
                                            "log.report"};

/* A valid value different from the default, for the round-trip test. */
static void other_value(const struct qc_config_option *o, const struct qc_config *cfg, char *buf,
                        size_t n)
{
    char cur[QC_CONFIG_STR_MAX + 32];
    qc_config_format_value(cfg, o, cur, sizeof cur);
    switch (o->type) {
    case QC_CONFIG_INT:
        snprintf(buf, n, "%lld",
                 (long long)(strtoll(cur, NULL, 10) == o->imax ? o->imin : o->imax));
        break;
    case QC_CONFIG_FLOAT:
        snprintf(buf, n, "%.17g", strtod(cur, NULL) == o->fmax ? o->fmin : o->fmax);
        break;
    case QC_CONFIG_SIZE:
        snprintf(buf, n, "%llu",
                 (unsigned long long)(strtoull(cur, NULL, 10) == o->smax ? o->smin : o->smax));
        break;
    case QC_CONFIG_BOOL:
        snprintf(buf, n, "%s", strcmp(cur, "true") == 0 ? "false" : "true");
        break;
    case QC_CONFIG_STRING:
        snprintf(buf, n, "dir \"with\" \\odd\tchars\n%.64s", cur);
        break;
    case QC_CONFIG_CHOICE:
        snprintf(buf, n, "%s", strcmp(cur, o->choices[0]) == 0 ? o->choices[1] : o->choices[0]);
        break;
    default:
        buf[0] = '\0';
    }
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qc_test_config.XXXXXX");
    if (!mkdtemp(tmp_dir))
        T_FATAL("mkdtemp failed");
    char profiles[512];
    snprintf(profiles, sizeof profiles, "%s/profiles", QC_SOURCE_DIR);
    setenv("QC_PROFILES_DIR", profiles, 1);

    QC_TEST ("config: defaults are the official AV2 configuration on one CPU rank") {
        struct qc_config c;
        qc_config_defaults(&c);
        T_EXPECT_EQ_I64(c.hidden_dim, 128, "D");
        T_EXPECT_EQ_I64(c.num_heads, 8, "H");
        T_EXPECT_EQ_I64(c.head_dim, 16, "Dh");
        T_EXPECT_EQ_I64(c.num_freq_bands, 64, "F");
        T_EXPECT_EQ_I64(c.num_historical_steps, 50, "T");
        T_EXPECT_EQ_I64(c.num_future_steps, 60, "Tf");
        T_EXPECT_EQ_I64(c.num_modes, 6, "K");
        T_EXPECT_EQ_I64(c.num_recurrent_steps, 3, "R");
        T_EXPECT_EQ_I64(c.num_map_layers, 1, "map layers");
        T_EXPECT_EQ_I64(c.num_agent_layers, 2, "agent layers");
        T_EXPECT_EQ_I64(c.num_dec_layers, 2, "dec layers");
        T_EXPECT_EQ_I64(c.time_span, 10, "time_span");
        T_EXPECT_EQ_I64(c.num_t2m_steps, 30, "t2m");
        T_EXPECT_EQ_I64(c.max_num_neighbors, 300, "neighbours");
        T_EXPECT(c.dropout == 0.1, "dropout %g", c.dropout);
        T_EXPECT(c.pl2pl_radius == 150 && c.pl2a_radius == 50 && c.a2a_radius == 50 &&
                     c.pl2m_radius == 150 && c.a2m_radius == 150,
                 "radii");
        T_EXPECT(c.lr == 5e-4 && c.weight_decay == 1e-4, "lr %g wd %g", c.lr, c.weight_decay);
        T_EXPECT_EQ_I64(c.t_max, 64, "T_max");
        T_EXPECT_EQ_I64(c.epochs, 64, "epochs");
        T_EXPECT_EQ_I64(c.batch_size, 4, "batch");
        T_EXPECT_EQ_I64(c.grad_accum, 1, "accum");
        T_EXPECT_EQ_I64(c.seed, 2023, "seed");
        T_EXPECT_EQ_I64(c.device_kind, 0, "cpu");
        T_EXPECT_EQ_U64(c.device_budget, 0, "budget");
        T_EXPECT_EQ_I64(c.world_size, 0, "ranks: the launcher's");
        T_EXPECT_EQ_U64(c.alloc_round, 512, "round");
        T_EXPECT_EQ_U64(c.alloc_small_max, 1u << 20, "small_max");
        T_EXPECT_EQ_U64(c.alloc_small_segment, 2u << 20, "small_segment");
        T_EXPECT_EQ_U64(c.alloc_large_segment, 20u << 20, "large_segment");
        T_EXPECT_EQ_I64(c.offload_queue_depth, 16, "queue depth");
        T_EXPECT_EQ_U64(c.offload_block_size, 1u << 20, "block");
        T_EXPECT_EQ_U64(c.offload_max_inflight, 64u << 20, "inflight");
        T_EXPECT(c.attention == QC_ATTENTION_FUSED, "attention");
        T_EXPECT(c.log_level == QC_LOG_INFO && !c.quiet, "log");
        T_EXPECT(qc_config_validate(&c) == QC_OK, "defaults validate: %s", qc_error_last());
    }

    QC_TEST ("config: the option table is complete and consistent") {
        int n = qc_config_option_count();
        T_EXPECT_EQ_I64(n, (int64_t)(sizeof required_keys / sizeof required_keys[0]),
                        "table size vs the issue's key list");
        for (size_t i = 0; i < sizeof required_keys / sizeof required_keys[0]; i++)
            T_EXPECT(qc_config_option_find(required_keys[i]) != NULL, "missing key %s",
                     required_keys[i]);
        for (int i = 0; i < n; i++) {
            const struct qc_config_option *o = qc_config_option_at(i);
            const char *dot = strchr(o->key, '.');
            T_EXPECT(dot && !strchr(dot + 1, '.'), "%s: one dot", o->key);
            T_EXPECT(o->doc && o->doc[0] && o->unit && o->def, "%s: doc/unit/def", o->key);
            T_EXPECT(qc_config_option_find(o->key) == o, "%s: duplicate key", o->key);
            for (int j = 0; j < i; j++)
                T_EXPECT(qc_config_option_at(j)->offset != o->offset, "%s and %s share a field",
                         o->key, qc_config_option_at(j)->key);
            switch (o->type) {
            case QC_CONFIG_INT:
                T_EXPECT(o->size == 8 && o->imin <= o->imax, "%s", o->key);
                T_EXPECT(o->imax <= 9007199254740991 && o->imin >= -9007199254740991,
                         "%s: beyond 2^53", o->key);
                break;
            case QC_CONFIG_FLOAT:
                T_EXPECT(o->size == 8 && o->fmin <= o->fmax, "%s", o->key);
                break;
            case QC_CONFIG_SIZE:
                T_EXPECT(o->size == 8 && o->smin <= o->smax && o->smax <= (1ull << 53), "%s",
                         o->key);
                break;
            case QC_CONFIG_BOOL:
                T_EXPECT(o->size == sizeof(bool), "%s", o->key);
                break;
            case QC_CONFIG_STRING:
                T_EXPECT(o->size == QC_CONFIG_STR_MAX, "%s", o->key);
                break;
            case QC_CONFIG_CHOICE:
                T_EXPECT(o->choices && o->choices[0] && o->choices[1], "%s: choices", o->key);
                T_EXPECT(o->size == sizeof(int) || o->size == 8, "%s", o->key);
                break;
            default:
                T_EXPECT(0, "%s: type %d", o->key, (int)o->type);
            }
            /* The default as the table writes it is what qc_config_defaults stored. */
            struct qc_config c;
            qc_config_defaults(&c);
            struct qc_config c2 = c;
            T_EXPECT(qc_config_set(&c2, o->key, o->def, "t") == QC_OK, "%s default '%s': %s",
                     o->key, o->def, qc_error_last());
            T_EXPECT(strcmp(value_of(&c, o->key), value_of(&c2, o->key)) == 0, "%s", o->key);
        }
    }

    QC_TEST ("config: a dump read back as a preset gives the same configuration") {
        struct qc_config a, b;
        qc_config_defaults(&a);
        /* change every key to another valid value (validation is not needed for this) */
        for (int i = 0; i < qc_config_option_count(); i++) {
            const struct qc_config_option *o = qc_config_option_at(i);
            char v[QC_CONFIG_STR_MAX];
            other_value(o, &a, v, sizeof v);
            T_EXPECT(qc_config_set(&a, o->key, v, "t") == QC_OK, "%s=%s: %s", o->key, v,
                     qc_error_last());
        }
        char *da = dump(&a);
        cJSON *root = cJSON_Parse(da);
        T_EXPECT(root != NULL, "dump is not valid JSON:\n%s", da);
        cJSON_Delete(root);
        qc_config_defaults(&b);
        T_EXPECT(qc_config_apply_preset_json(&b, da, strlen(da), "dump.json") == QC_OK, "%s",
                 qc_error_last());
        char *db = dump(&b);
        T_EXPECT(strcmp(da, db) == 0, "round trip differs:\n%s\n---\n%s", da, db);
        for (int i = 0; i < qc_config_option_count(); i++) {
            const char *k = qc_config_option_at(i)->key;
            char va[QC_CONFIG_STR_MAX + 32];
            snprintf(va, sizeof va, "%s", value_of(&a, k));
            T_EXPECT(strcmp(va, value_of(&b, k)) == 0, "%s: %s vs %s", k, va, value_of(&b, k));
        }
        char *d2 = NULL;
        FILE *f = open_memstream(&d2, &(size_t){0});
        T_EXPECT(qc_config_dump_json(&a, f) == QC_OK, "dump_json");
        fclose(f);
        T_EXPECT(d2 && strcmp(d2, da) == 0, "dump_json and to_json agree");
        free(d2);
        free(da);
        free(db);
    }

    QC_TEST ("config: the dump is nested by section with sizes in bytes and choices by name") {
        struct qc_config c;
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_set(&c, "device.budget=24GiB") == QC_OK, "%s", qc_error_last());
        T_EXPECT(qc_config_apply_set(&c, "plan.policy=recompute") == QC_OK, "%s", qc_error_last());
        char *d = dump(&c);
        cJSON *root = cJSON_Parse(d);
        const cJSON *budget = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(root, "device"), "budget");
        T_EXPECT(cJSON_IsNumber(budget) && budget->valuedouble == 25769803776.0, "budget");
        T_EXPECT_STR_CONTAINS(d, "\"budget\": 25769803776");
        const cJSON *pol = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(root, "plan"), "policy");
        T_EXPECT(cJSON_IsString(pol) && strcmp(pol->valuestring, "recompute") == 0, "policy");
        /* sections appear in table order, each once */
        const char *order[] = {"model",   "train", "data", "device", "alloc",
                               "offload", "hw",    "dist", "plan",   "log"};
        int k = 0;
        for (const cJSON *s = root ? root->child : NULL; s; s = s->next, k++)
            T_EXPECT(k < 10 && strcmp(s->string, order[k]) == 0, "section %d is %s", k, s->string);
        T_EXPECT_EQ_I64(k, 10, "sections");
        cJSON_Delete(root);
        free(d);
    }

    QC_TEST ("config: every shipped preset loads, validates and has a description") {
        DIR *d = opendir(profiles);
        T_EXPECT(d != NULL, "cannot open %s", profiles);
        int n = 0;
        struct dirent *e;
        while (d && (e = readdir(d))) {
            size_t len = strlen(e->d_name);
            if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0)
                continue;
            n++;
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(len - 5), e->d_name);
            struct qc_config c;
            qc_config_defaults(&c);
            T_EXPECT(qc_config_apply_preset(&c, name) == QC_OK, "%s: %s", name, qc_error_last());
            T_EXPECT(qc_config_validate(&c) == QC_OK, "%s: %s", name, qc_error_last());
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", profiles, e->d_name);
            FILE *f = fopen(path, "rb");
            char buf[65536];
            size_t got = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
            if (f)
                fclose(f);
            buf[got] = '\0';
            cJSON *root = cJSON_Parse(buf);
            const cJSON *desc = cJSON_GetObjectItemCaseSensitive(root, "description");
            T_EXPECT(cJSON_IsString(desc) && strlen(desc->valuestring) > 20, "%s: description",
                     name);
            cJSON_Delete(root);
        }
        if (d)
            closedir(d);
        T_EXPECT(n >= 5, "only %d presets", n);
    }

    QC_TEST ("config: shipped presets hold what the issue asks for") {
        struct qc_config c;
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_preset(&c, "rtx3090x8") == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_I64(c.world_size, 8, "rtx3090x8 ranks");
        T_EXPECT_EQ_U64(c.device_budget, 23ull << 30, "rtx3090x8 budget: 24 GiB less the reserve");
        T_EXPECT_EQ_U64(c.hw_device_memory, 24ull << 30, "rtx3090x8 card");
        T_EXPECT_EQ_U64(c.hw_device_reserve, 1ull << 30, "rtx3090x8 reserve");
        T_EXPECT(c.hw_tflops > 0 && c.hw_mem_gbps > 0, "rtx3090x8 roofline figures");
        T_EXPECT_EQ_I64(c.device_kind, 1, "cuda");
        T_EXPECT_EQ_I64(c.hw_gpus_per_node, 8, "gpus per node");
        T_EXPECT(c.hw_pcie_gbps >= 20 && c.hw_pcie_gbps <= 32, "PCIe 4.0 x16: %g", c.hw_pcie_gbps);
        T_EXPECT(c.hw_nvme_gbps == 3.5, "nvme %g", c.hw_nvme_gbps);
        T_EXPECT(c.hidden_dim == 128 && c.batch_size == 4 && c.lr == 5e-4, "inherits qcnet-av2");

        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_preset(&c, "rtx3090x1-b32") == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_I64(c.batch_size * c.grad_accum * c.world_size, 32, "global batch");
        T_EXPECT_EQ_I64(c.world_size, 1, "one GPU");
        T_EXPECT_EQ_U64(c.device_budget, 23ull << 30, "24 GiB less the reserve");

        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_preset(&c, "h200x1") == QC_OK, "%s", qc_error_last());
        T_EXPECT(c.device_kind == 1 && c.world_size == 1, "one H200");
        T_EXPECT(c.device_budget >= (100ull << 30) &&
                     c.device_budget + c.hw_device_reserve == c.hw_device_memory,
                 "budget: the card less the reserve");
        T_EXPECT(c.hw_pcie_gbps > 25, "PCIe 5.0: %g", c.hw_pcie_gbps);

        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_preset(&c, "cpu-smoke") == QC_OK, "%s", qc_error_last());
        T_EXPECT(c.hidden_dim == 32 && c.num_heads == 2 && c.head_dim == 16, "small model");
        T_EXPECT(c.num_freq_bands == 8 && c.batch_size == 2 && c.device_kind == 0, "smoke");
        T_EXPECT(c.steps > 0 && c.steps <= 50 && c.synthetic_scenes <= 100, "short run");
        T_EXPECT(c.synthetic_profile == QC_SCENE_TYPICAL, "typical scenes");

        qc_config_defaults(&c);
        struct qc_config d;
        qc_config_defaults(&d);
        T_EXPECT(qc_config_apply_preset(&c, "qcnet-av2") == QC_OK, "%s", qc_error_last());
        char *dc = dump(&c), *dd = dump(&d);
        T_EXPECT(strcmp(dc, dd) == 0, "qcnet-av2 equals the built-in defaults");
        free(dc);
        free(dd);
    }

    QC_TEST ("config: precedence defaults < presets in order < --set") {
        struct qc_config c;
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_preset(&c, "cpu-smoke") == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_I64(c.hidden_dim, 32, "preset over defaults");
        T_EXPECT(qc_config_apply_preset(&c, "rtx3090x8") == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_I64(c.hidden_dim, 128, "the later preset wins (through its parent)");
        T_EXPECT_EQ_I64(c.steps, 20, "keys the later preset does not set stay");
        T_EXPECT(qc_config_apply_set(&c, "dist.world_size=2") == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_I64(c.world_size, 2, "--set over presets");
        T_EXPECT(qc_config_apply_set(&c, "dist.world_size=3") == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_I64(c.world_size, 3, "the later --set wins");
    }

    QC_TEST ("config: names are searched in $QC_PROFILES_DIR first") {
        write_file("cpu-smoke.json", "{\"train.seed\": 77}");
        setenv("QC_PROFILES_DIR", tmp_dir, 1);
        struct qc_config c;
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_preset(&c, "cpu-smoke") == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_I64(c.seed, 77, "the $QC_PROFILES_DIR copy");
        T_EXPECT_EQ_I64(c.hidden_dim, 128, "not the source tree's cpu-smoke");
        /* a name missing there falls back to the source tree */
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_preset(&c, "rtx3090x8") == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_I64(c.world_size, 8, "fallback to QC_SOURCE_DIR/profiles");
        char path[1024];
        T_EXPECT(qc_config_preset_path("cpu-smoke", path, sizeof path) == QC_OK, "path");
        T_EXPECT(strcmp(path, tmp_path("cpu-smoke.json")) == 0, "resolved %s", path);
        unlink(tmp_path("cpu-smoke.json"));
        setenv("QC_PROFILES_DIR", profiles, 1);
    }

    QC_TEST ("config: inheritance chains, flat and nested keys, relative paths") {
        setenv("QC_PROFILES_DIR", tmp_dir, 1);
        write_file("base.json",
                   "{\"description\": \"b\", \"model.hidden_dim\": 64,"
                   " \"model\": {\"head_dim\": 8}, \"train\": {\"seed\": 1, \"lr\": 0.25}}");
        write_file("mid.json", "{\"inherits\": \"base\", \"train\": {\"seed\": 2},"
                               " \"device\": {\"budget\": \"512MiB\"}}");
        write_file("leaf.json",
                   "{\"inherits\": \"mid\", \"train.seed\": 3, \"data.shuffle\": false}");
        mkdir(tmp_path("sub"), 0755);
        write_file("sub/rel.json", "{\"inherits\": \"../mid.json\", \"log.level\": \"debug\"}");
        struct qc_config c;
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_preset(&c, "leaf") == QC_OK, "%s", qc_error_last());
        T_EXPECT_EQ_I64(c.seed, 3, "child overrides parent");
        T_EXPECT_EQ_I64(c.hidden_dim, 64, "grandparent flat key");
        T_EXPECT_EQ_I64(c.head_dim, 8, "grandparent nested key");
        T_EXPECT(c.lr == 0.25, "grandparent key kept: %g", c.lr);
        T_EXPECT_EQ_U64(c.device_budget, 512u << 20, "parent size");
        T_EXPECT(!c.shuffle, "leaf bool");
        T_EXPECT(qc_config_validate(&c) == QC_OK, "%s", qc_error_last());
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_preset(&c, tmp_path("sub/rel.json")) == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(c.seed == 2 && c.log_level == QC_LOG_DEBUG, "relative inherits path");
        setenv("QC_PROFILES_DIR", profiles, 1);
    }

    QC_TEST ("config: inheritance cycles are reported with the whole chain") {
        setenv("QC_PROFILES_DIR", tmp_dir, 1);
        write_file("a.json", "{\"inherits\": \"b\"}");
        write_file("b.json", "{\"inherits\": \"a\", \"train.seed\": 5}");
        write_file("s.json", "{\"inherits\": \"s\"}");
        write_file("c1.json", "{\"inherits\": \"c2\"}");
        write_file("c2.json", "{\"inherits\": \"c3\"}");
        write_file("c3.json", "{\"inherits\": \"c2.json\"}");
        struct qc_config c, before;
        qc_config_defaults(&c);
        memcpy(&before, &c, sizeof c);
        T_EXPECT(qc_config_apply_preset(&c, "a") == QC_ERR_INVALID, "a->b->a");
        T_EXPECT(strcmp(qc_error_last(), "preset inheritance cycle: a -> b -> a") == 0, "[%s]",
                 qc_error_last());
        T_EXPECT(qc_config_apply_preset(&c, "s") == QC_ERR_INVALID, "s->s");
        T_EXPECT(strcmp(qc_error_last(), "preset inheritance cycle: s -> s") == 0, "[%s]",
                 qc_error_last());
        T_EXPECT(qc_config_apply_preset(&c, "c1") == QC_ERR_INVALID, "c1->c2->c3->c2");
        T_EXPECT(strcmp(qc_error_last(), "preset inheritance cycle: c1 -> c2 -> c3 -> c2.json") ==
                     0,
                 "[%s]", qc_error_last());
        T_EXPECT(memcmp(&c, &before, sizeof c) == 0, "failed presets leave cfg unchanged");
        setenv("QC_PROFILES_DIR", profiles, 1);
    }

    QC_TEST ("config: preset errors name the file, the key and the value") {
        expect_file_error("unknown.json", "{\"device.budgt\": \"24GiB\"}",
                          "key 'device.budgt': unknown key\nhint: did you mean 'device.budget'?");
        expect_file_error("unknown_nested.json", "{\"device\": {\"budgt\": 1}}",
                          "key 'device.budgt': unknown key\nhint: did you mean 'device.budget'?");
        expect_file_error("unknown_far.json", "{\"zzzzzz.qqqq\": 1}",
                          "key 'zzzzzz.qqqq': unknown key\nhint: `qctrain config options` lists "
                          "every key");
        expect_file_error("int_text.json", "{\"model\": {\"hidden_dim\": \"abc\"}}",
                          "key 'model.hidden_dim': expected an integer, got \"abc\"");
        expect_file_error("int_frac.json", "{\"model.hidden_dim\": 1.5}",
                          "key 'model.hidden_dim': expected an integer, got 1.5");
        expect_file_error("bool_num.json", "{\"data.shuffle\": 1}",
                          "key 'data.shuffle': expected true or false, got 1");
        expect_file_error("str_num.json", "{\"train.out_dir\": 5}",
                          "key 'train.out_dir': expected a string, got 5");
        expect_file_error("float_arr.json", "{\"train.lr\": [1, 2]}",
                          "key 'train.lr': expected a number, got [1,2]");
        expect_file_error("range_int.json", "{\"model.hidden_dim\": 0}",
                          "key 'model.hidden_dim': out of range [1, 4096]: 0");
        expect_file_error("range_float.json", "{\"model\": {\"dropout\": 1.5}}",
                          "key 'model.dropout': out of range [0, 1]: 1.5");
        expect_file_error("range_size.json", "{\"alloc.round\": \"2MiB\"}",
                          "key 'alloc.round': out of range [1, 1048576]: 2097152");
        expect_file_error("range_stage.json", "{\"dist.zero_stage\": 3}",
                          "key 'dist.zero_stage': out of range [0, 2]: 3");
        expect_file_error("size_unit.json", "{\"device.budget\": \"24GX\"}",
                          "key 'device.budget': expected a size such as 24GiB, 512MiB, 1e9 or "
                          "4096, got \"24GX\"\nhint: units are B, KiB, MiB, GiB, TiB (powers of "
                          "1024) or KB, MB, GB, TB (powers of 1000)");
        expect_file_error("size_neg.json", "{\"device.budget\": -1}",
                          "key 'device.budget': expected a size such as 24GiB, 512MiB, 1e9 or "
                          "4096, got -1\nhint: units are B, KiB, MiB, GiB, TiB (powers of "
                          "1024) or KB, MB, GB, TB (powers of 1000)");
        expect_file_error(
            "choice.json", "{\"device.kind\": \"cudaa\"}",
            "key 'device.kind': expected one of cpu, cuda, emu, got \"cudaa\"\nhint: did "
            "you mean 'cuda'?");
        expect_file_error("choice_far.json", "{\"model.attention\": \"flash\"}",
                          "key 'model.attention': expected one of fused, unfused, got \"flash\"");
        expect_file_error("malformed.json", "{\"model\": {\"hidden_dim\": 1,}",
                          "malformed JSON near line 1, column 29");
        expect_file_error("malformed2.json", "{\n  \"train.seed\": 1,\n}\n",
                          "malformed JSON near line 3, column 2");
        expect_file_error("garbage.json", "{} x", "malformed JSON near line 1, column 4");
        expect_file_error("empty.json", "", "malformed JSON near line 1, column 1");
        expect_file_error("array.json", "[1, 2]", "expected a JSON object of keys, got [1,2]");
        expect_file_error("inherits_num.json", "{\"inherits\": 3}",
                          "key 'inherits': expected a preset name or path, got 3");
        expect_file_error("desc_num.json", "{\"description\": false}",
                          "key 'description': expected a string, got false");
        char big[1200];
        memset(big, 'x', sizeof big);
        big[sizeof big - 1] = '\0';
        char text[1400];
        snprintf(text, sizeof text, "{\"train.out_dir\": \"%s\"}", big);
        struct qc_config c;
        T_EXPECT(apply_text(&c, "long.json", text) == QC_ERR_INVALID, "long string");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "key 'train.out_dir': longer than 1023 bytes");
    }

    QC_TEST ("config: missing presets and files") {
        struct qc_config c;
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_preset(&c, "/nonexistent/x.json") == QC_ERR_INVALID, "path");
        T_EXPECT(strcmp(qc_error_last(),
                        "/nonexistent/x.json: cannot open: No such file or directory") == 0,
                 "[%s]", qc_error_last());
        T_EXPECT(qc_config_apply_preset(&c, "cpu-smok") == QC_ERR_INVALID, "near name");
        T_EXPECT(strncmp(qc_error_last(), "preset 'cpu-smok' not found (searched ", 38) == 0,
                 "[%s]", qc_error_last());
        T_EXPECT_STR_CONTAINS(qc_error_last(), "\nhint: did you mean 'cpu-smoke'?");
        T_EXPECT(qc_config_apply_preset(&c, "zzzzzzzzz") == QC_ERR_INVALID, "far name");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "\nhint: presets available: cpu-smoke, h200x1");
        T_EXPECT(qc_config_apply_preset(&c, tmp_dir) == QC_ERR_INVALID, "a folder");
        T_EXPECT_STR_CONTAINS(qc_error_last(), ": is a folder, not a regular file");
        write_file("inh_missing.json", "{\"inherits\": \"no-such-preset\"}");
        T_EXPECT(qc_config_apply_preset(&c, tmp_path("inh_missing.json")) == QC_ERR_INVALID,
                 "missing parent");
        T_EXPECT_STR_CONTAINS(qc_error_last(), "preset 'no-such-preset' not found");
        T_EXPECT(qc_config_apply_preset(&c, "") == QC_ERR_INVALID, "empty name");
    }

    QC_TEST ("config: a preset giving a key twice or a \\u0000 in a string is refused") {
        struct qc_config c, before;
        qc_config_defaults(&c);
        memcpy(&before, &c, sizeof c);
        static const char *const dup[] = {
            "{\"train.lr\": 1e-3, \"train.lr\": 2e-3}",
            "{\"train\": {\"lr\": 1e-3}, \"train.lr\": 2e-3}",
            "{\"train\": {\"lr\": 1e-3}, \"train\": {\"seed\": 3}}",
            "{\"train\": {\"lr\": 1e-3, \"lr\": 2e-3}}",
            "{\"description\": \"a\", \"description\": \"b\"}",
        };
        for (size_t i = 0; i < sizeof dup / sizeof dup[0]; i++) {
            T_EXPECT(qc_config_apply_preset_json(&c, dup[i], strlen(dup[i]), "dup.json") ==
                         QC_ERR_INVALID,
                     "accepted %s", dup[i]);
            T_EXPECT(strncmp(qc_error_last(), "dup.json: key '", 15) == 0 &&
                         strstr(qc_error_last(), "twice") && strstr(qc_error_last(), "hint:"),
                     "%s: [%s]", dup[i], qc_error_last());
        }
        T_EXPECT(memcmp(&c, &before, sizeof c) == 0, "cfg unchanged");
        static const char *const nul[] = {
            "{\"description\": \"ab\\u0000cd\"}",
            "{\"train.out_dir\": \"runs/a\\u0000b\"}",
            "{\"train.out_dir\\u0000x\": \"runs\"}",
        };
        for (size_t i = 0; i < sizeof nul / sizeof nul[0]; i++) {
            T_EXPECT(qc_config_apply_preset_json(&c, nul[i], strlen(nul[i]), "nul.json") ==
                         QC_ERR_INVALID,
                     "accepted %s", nul[i]);
            T_EXPECT_STR_CONTAINS(qc_error_last(), "nul.json: line 1: a string holds \\u0000");
        }
        T_EXPECT(memcmp(&c, &before, sizeof c) == 0, "cfg unchanged");
        /* an escaped backslash followed by u0000 is plain text */
        const char *ok = "{\"train.out_dir\": \"runs/a\\\\u0000\"}";
        T_EXPECT(qc_config_apply_preset_json(&c, ok, strlen(ok), "ok.json") == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT(strcmp(c.out_dir, "runs/a\\u0000") == 0, "out_dir [%s]", c.out_dir);
    }

    QC_TEST ("config: a failed preset leaves the configuration unchanged") {
        struct qc_config c, before;
        qc_config_defaults(&c);
        memcpy(&before, &c, sizeof c);
        write_file("half.json", "{\"model.hidden_dim\": 64, \"train.seed\": 9, \"bogus.key\": 1}");
        T_EXPECT(qc_config_apply_preset(&c, tmp_path("half.json")) == QC_ERR_INVALID, "fails");
        T_EXPECT(memcmp(&c, &before, sizeof c) == 0, "cfg unchanged");
        const char *text = "{\"train.seed\": 9, \"train.lr\": \"x\"}";
        T_EXPECT(qc_config_apply_preset_json(&c, text, strlen(text), "mem.json") == QC_ERR_INVALID,
                 "in-memory fails");
        T_EXPECT(
            strcmp(qc_error_last(), "mem.json: key 'train.lr': expected a number, got \"x\"") == 0,
            "[%s]", qc_error_last());
        T_EXPECT(memcmp(&c, &before, sizeof c) == 0, "cfg unchanged");
        const char nul[] = "{\"train.seed\": 9}\0{}";
        T_EXPECT(qc_config_apply_preset_json(&c, nul, sizeof nul - 1, "nul.json") == QC_ERR_INVALID,
                 "embedded NUL");
        T_EXPECT(strcmp(qc_error_last(), "nul.json: malformed JSON: contains a NUL byte") == 0,
                 "[%s]", qc_error_last());
        /* not NUL-terminated: only len bytes are read */
        const char part[] = "{\"train.seed\": 9}garbage";
        T_EXPECT(qc_config_apply_preset_json(&c, part, 17, "part.json") == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT_EQ_I64(c.seed, 9, "buffer of given length");
    }

    QC_TEST ("config: sizes with units") {
        struct {
            const char *text;
            uint64_t bytes;
        } ok[] = {
            {"24GiB", 25769803776ull},
            {"512MiB", 536870912ull},
            {"1e9", 1000000000ull},
            {"4096", 4096},
            {"0", 0},
            {"1.5KiB", 1536},
            {"2 GiB", 2147483648ull},
            {"3kb", 3000},
            {"1TB", 1000000000000ull},
            {"1T", 1ull << 40},
            {"7B", 7},
            {"0.5MiB", 524288},
            {"0.48GiB", 515396075ull}, /* 515396075.52: a larger unit's fraction rounds down */
            {"18446744073709551615", 18446744073709551615ull},
        };
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
            uint64_t v = 1;
            T_EXPECT(qc_parse_size(ok[i].text, &v) == QC_OK, "%s: %s", ok[i].text, qc_error_last());
            T_EXPECT_EQ_U64(v, ok[i].bytes, "%s", ok[i].text);
        }
        const char *bad[] = {
            "",     "abc",    "-1",  "1.5",   "24GX", "1e30", "18446744073709551616",
            "0.1B", "1  GiB", "GiB", "1GiBx", "nan",  "inf",  "1e"};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            uint64_t v = 12345;
            T_EXPECT(qc_parse_size(bad[i], &v) == QC_ERR_INVALID, "'%s' should be rejected",
                     bad[i]);
            T_EXPECT_EQ_U64(v, 12345, "out untouched for '%s'", bad[i]);
        }
        uint64_t v;
        qc_parse_size("24GX", &v);
        T_EXPECT(strcmp(qc_error_last(),
                        "expected a size such as 24GiB, 512MiB, 1e9 or 4096, got \"24GX\"\nhint: "
                        "units are B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB "
                        "(powers of 1000)") == 0,
                 "[%s]", qc_error_last());
        struct qc_config c;
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_set(&c, "device.budget=24GiB") == QC_OK, "set");
        T_EXPECT_EQ_U64(c.device_budget, 25769803776ull, "budget");
        T_EXPECT(apply_text(&c, "num_size.json", "{\"device.budget\": 1073741824}") == QC_OK, "%s",
                 qc_error_last());
        T_EXPECT_EQ_U64(c.device_budget, 1ull << 30, "JSON number of bytes");
    }

    QC_TEST ("config: --set parsing") {
        struct qc_config c;
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_set(&c, "train.out_dir=a=b") == QC_OK, "%s", qc_error_last());
        T_EXPECT(strcmp(c.out_dir, "a=b") == 0, "value keeps its '=': %s", c.out_dir);
        T_EXPECT(qc_config_apply_set(&c, "train.out_dir=") == QC_OK, "empty string");
        T_EXPECT(c.out_dir[0] == '\0', "empty");
        T_EXPECT(qc_config_apply_set(&c, "data.shuffle=no") == QC_OK && !c.shuffle, "no");
        T_EXPECT(qc_config_apply_set(&c, "data.shuffle=ON") == QC_OK && c.shuffle, "ON");
        T_EXPECT(qc_config_apply_set(&c, "train.steps=1e3") == QC_OK && c.steps == 1000, "1e3");
        T_EXPECT(qc_config_apply_set(&c, "train.seed=9007199254740991") == QC_OK &&
                     c.seed == 9007199254740991,
                 "2^53-1");
        T_EXPECT(qc_config_apply_set(&c, "train.lr=1e-3") == QC_OK && c.lr == 1e-3, "float");
        T_EXPECT(qc_config_apply_set(&c, "log.level=debug") == QC_OK && c.log_level == QC_LOG_DEBUG,
                 "int64 choice");
        T_EXPECT(qc_config_apply_set(&c, "model.attention=unfused") == QC_OK &&
                     c.attention == QC_ATTENTION_UNFUSED,
                 "enum choice");
        expect_set_error("foo", "--set: expected key=value, got \"foo\"\nhint: e.g. --set "
                                "device.budget=24GiB");
        expect_set_error("=5", "--set: expected key=value, got \"=5\"\nhint: e.g. --set "
                               "device.budget=24GiB");
        expect_set_error("model.hidden_dim=abc",
                         "--set: key 'model.hidden_dim': expected an integer, got \"abc\"");
        expect_set_error("model.hidden_dim=", "--set: key 'model.hidden_dim': expected an integer, "
                                              "got \"\"");
        expect_set_error("model.hidden_dim= 5", "--set: key 'model.hidden_dim': expected an "
                                                "integer, got \" 5\"");
        expect_set_error("train.lr=fast", "--set: key 'train.lr': expected a number, got \"fast\"");
        expect_set_error("train.lr=nan", "--set: key 'train.lr': expected a number, got \"nan\"");
        expect_set_error("data.shuffle=maybe",
                         "--set: key 'data.shuffle': expected true or false, got \"maybe\"");
        expect_set_error("budget=1", "--set: key 'budget': unknown key\nhint: did you mean "
                                     "'device.budget'?");
        expect_set_error("train.seed=-1", "--set: key 'train.seed': out of range [0, "
                                          "9007199254740991]: -1");
    }

    QC_TEST ("config: cross-field validation") {
        expect_validate_error("model.hidden_dim=64", NULL,
                              "invalid configuration: model.num_heads * model.head_dim = 8 * 16 = "
                              "128 but model.hidden_dim = 64\nhint:");
        expect_validate_error("model.num_recurrent_steps=7", NULL,
                              "invalid configuration: model.num_recurrent_steps = 7 does not "
                              "divide model.num_future_steps = 60");
        expect_validate_error("model.num_t2m_steps=51", NULL,
                              "invalid configuration: model.num_t2m_steps = 51 exceeds "
                              "model.num_historical_steps = 50");
        expect_validate_error("model.dropout=1", NULL,
                              "invalid configuration: model.dropout = 1 must be < 1");
        expect_validate_error("alloc.round=768", NULL,
                              "invalid configuration: alloc.round = 768 is not a power of two");
        expect_validate_error("alloc.small_max=4MiB", NULL,
                              "invalid configuration: alloc.small_max = 4194304 exceeds "
                              "alloc.small_segment = 2097152");
        expect_validate_error("alloc.small_segment=64MiB", "alloc.small_max=1MiB",
                              "invalid configuration: alloc.small_segment = 67108864 exceeds "
                              "alloc.large_segment = 20971520");
        expect_validate_error("offload.block_size=5000", NULL,
                              "invalid configuration: offload.block_size = 5000 is not a multiple "
                              "of 4096");
        expect_validate_error("offload.max_inflight=64KiB", NULL,
                              "invalid configuration: offload.max_inflight = 65536 is less than "
                              "offload.block_size = 1048576");
        expect_validate_error("offload.placement=nvme", NULL,
                              "invalid configuration: offload.placement = nvme needs "
                              "offload.nvme_dir");
        expect_validate_error("train.global_batch=6", NULL,
                              "invalid configuration: train.global_batch = 6 but train.batch_size "
                              "x train.grad_accum x dist.world_size = 4 x 1 x 1 = 4\nhint:");
        struct qc_config c;
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_set(&c, "train.global_batch=8") == QC_OK &&
                     qc_config_apply_set(&c, "train.grad_accum=2") == QC_OK &&
                     qc_config_validate(&c) == QC_OK,
                 "4 x 2 = 8 validates: %s", qc_error_last());
        qc_config_defaults(&c);
        T_EXPECT(qc_config_apply_set(&c, "model.hidden_dim=64") == QC_OK &&
                     qc_config_apply_set(&c, "model.head_dim=8") == QC_OK &&
                     qc_config_validate(&c) == QC_OK,
                 "8 x 8 = 64 validates: %s", qc_error_last());
    }

    QC_TEST ("config: key suggestions and edit distance") {
        T_EXPECT_EQ_I64(qc_edit_distance("kitten", "sitting"), 3, "classic");
        T_EXPECT_EQ_I64(qc_edit_distance("", "abc"), 3, "empty");
        T_EXPECT_EQ_I64(qc_edit_distance("abc", ""), 3, "empty");
        T_EXPECT_EQ_I64(qc_edit_distance("same", "same"), 0, "equal");
        T_EXPECT_EQ_I64(qc_edit_distance("budgt", "budget"), 1, "insertion");
        const char *s = qc_config_option_suggest("device.budgt");
        T_EXPECT(s && strcmp(s, "device.budget") == 0, "budgt -> %s", s ? s : "NULL");
        s = qc_config_option_suggest("world_size");
        T_EXPECT(s && strcmp(s, "dist.world_size") == 0, "bare name -> %s", s ? s : "NULL");
        s = qc_config_option_suggest("modle.hidden_dim");
        T_EXPECT(s && strcmp(s, "model.hidden_dim") == 0, "section typo -> %s", s ? s : "NULL");
        T_EXPECT(qc_config_option_suggest("xy") == NULL, "nothing close to 'xy'");
        T_EXPECT(qc_config_option_suggest("completely.different") == NULL, "nothing close");
    }

    QC_TEST ("config: the options listing shows every key with its default") {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        qc_config_print_options(f);
        fclose(f);
        for (int i = 0; i < qc_config_option_count(); i++)
            T_EXPECT_STR_CONTAINS(text, qc_config_option_at(i)->key);
        T_EXPECT_STR_CONTAINS(text, "fused|unfused");
        T_EXPECT_STR_CONTAINS(text, "[1, 4096]");
        T_EXPECT_STR_CONTAINS(text, "20MiB");
        T_EXPECT_STR_CONTAINS(text, "[4KiB, 1GiB]"); /* offload.block_size, sizes in units */
        free(text);
    }

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0)
        printf("note: could not remove %s\n", tmp_dir);
    return qc_test_summary();
}
