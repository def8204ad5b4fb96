/*
 * edit_distance.c — Levenshtein distance (qc_edit_distance.h), two rows of at most 257 ints.
 */
#include "qc_edit_distance.h"

#include <string.h>

#define EDIT_MAX 256 /* longer strings are simply "far" from everything */

int qc_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > EDIT_MAX || lb > EDIT_MAX)
        return (int)(la > lb ? la : lb);
    int prev[EDIT_MAX + 1], cur[EDIT_MAX + 1];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1;
            int ins = cur[j - 1] + 1;
            int m = sub < del ? sub : del;
            cur[j] = m < ins ? m : ins;
        }
        memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
    }
    return prev[lb];
}
