/*
 * train_cli.c — the option handling `qctrain train` and `qctrain eval` share after
 * qc_cli_parse (src/cmd_train.c, src/cmd_eval.c): data files given after the first --data, and
 * --attention; a data file that cannot be opened is bad input (QC_ERR_INVALID: exit 2), named
 * before anything runs. The device is the global --device (device.kind), set up by the trainer and
 * by qc_eval_run through qc_train_backend_create.
 */
#include "qc_train.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "qc_cli.h"
#include "qc_config.h"

enum qc_status qc_train_cli_finish(const char *cmd, const char *const *pos, int npos,
                                   struct qc_cli_strings *data, const char *attention,
                                   struct qc_config *cfg)
{
    /* `--data a.qcshard b.qcshard`: the files after the first arrive as positionals */
    for (int i = 0; i < npos; i++) {
        if (data->n == 0)
            return qc_errorf(QC_ERR_INVALID,
                             "%s: unexpected argument '%s'\nhint: data files go after --data", cmd,
                             pos[i]);
        if (data->n >= QC_CLI_STRINGS_MAX)
            return qc_errorf(QC_ERR_INVALID, "%s: more than %d data files", cmd,
                             QC_CLI_STRINGS_MAX);
        data->v[data->n++] = pos[i];
    }
    for (int i = 0; i < data->n; i++) {
        /* O_NONBLOCK: a FIFO given as data must not block here (it is refused later as not a
         * qcshard file) */
        const int fd = open(data->v[i], O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0)
            return qc_errorf(QC_ERR_INVALID, "%s: --data %s: cannot open: %s", cmd, data->v[i],
                             strerror(errno));
        close(fd);
    }
    if (attention) {
        if (strcmp(attention, "fused") == 0)
            cfg->attention = QC_ATTENTION_FUSED;
        else if (strcmp(attention, "unfused") == 0)
            cfg->attention = QC_ATTENTION_UNFUSED;
        else
            return qc_errorf(QC_ERR_INVALID, "%s: --attention '%s': expected fused or unfused", cmd,
                             attention);
    }
    return QC_OK;
}

enum qc_status qc_train_cli_rebase(const struct qc_cli *cli, const struct qc_config *base,
                                   const char *ckpt_dir, struct qc_config *out)
{
    struct qc_config c = *base;
    for (int i = 0; cli->presets && i < cli->presets->n; i++)
        QC_TRY(qc_config_apply_preset(&c, cli->presets->v[i]));
    for (int i = 0; cli->sets && i < cli->sets->n; i++)
        QC_TRY(qc_config_apply_set(&c, cli->sets->v[i]));
    /* where the run executes is this process's: the saved configuration has the defaults
     * (docs/CHECKPOINTS.md, Devices) */
    c.device_kind = cli->cfg.device_kind;
    c.device_ordinal = cli->cfg.device_ordinal;
    /* so are the ranks: the saved dist.world_size is the one the run had (resolved), and a
     * checkpoint resumes on another world size (docs/CHECKPOINTS.md) */
    c.world_size = cli->cfg.world_size;
    if (cli->device)
        QC_TRY(qc_config_set(&c, "device.kind", cli->device, "--device"));
    if (cli->log_level)
        QC_TRY(qc_config_set(&c, "log.level", cli->log_level, "--log-level"));
    c.quiet = cli->cfg.quiet;
    if (ckpt_dir)
        QC_TRY(qc_checkpoint_check_model_config(base, &c, ckpt_dir));
    QC_TRY(qc_config_validate(&c));
    *out = c;
    return QC_OK;
}
