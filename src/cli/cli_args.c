/*
 * cli_args.c — placeholder until the option parser lands.
 */
#include "qc_cli.h"

#include <string.h>

int qc_edit_distance(const char *a, const char *b)
{
    return strcmp(a, b) == 0 ? 0 : 99;
}
