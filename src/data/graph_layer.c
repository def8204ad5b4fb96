/*
 * graph_layer.c — edge-set names, the ×K views of the decoder sets as the attention layers see
 * them (QCNET.md §5.4), and packing a built graph into one block.
 */
#include "qc_graph.h"

#include <stdbool.h>
#include <string.h>

static const char *const set_names[QC_EDGE_SET_COUNT] = {
    "pt2pl", "pl2pl", "t", "pl2a", "a2a", "t2m", "pl2m", "a2m", "m2m",
};
static const int set_feat[QC_EDGE_SET_COUNT] = {3, 3, 4, 3, 3, 4, 3, 3, 0};

const char *qc_edge_set_name(enum qc_edge_set s)
{
    if ((int)s < 0 || s >= QC_EDGE_SET_COUNT)
        return "?";
    return set_names[s];
}

int qc_edge_set_from_name(const char *name)
{
    for (int s = 0; s < QC_EDGE_SET_COUNT; s++)
        if (strcmp(name, set_names[s]) == 0)
            return s;
    return -1;
}

int qc_edge_set_num_feat(enum qc_edge_set s)
{
    QC_ASSERT((int)s >= 0 && s < QC_EDGE_SET_COUNT, "edge set %d", (int)s);
    return set_feat[s];
}

static bool is_expanded(enum qc_edge_set s)
{
    return s == QC_EDGE_T2M || s == QC_EDGE_PL2M || s == QC_EDGE_A2M;
}

int64_t qc_graph_layer_num_edges(const struct qc_graph *g, enum qc_edge_set s)
{
    int64_t e = g->e[s].num_edges;
    return is_expanded(s) ? e * g->num_modes : e;
}

int64_t qc_graph_layer_num_dst(const struct qc_graph *g, enum qc_edge_set s)
{
    return is_expanded(s) ? g->num_modes * g->num_agents : g->e[s].num_dst;
}

int64_t qc_graph_total_layer_edges(const struct qc_graph *g)
{
    int64_t n = 0;
    for (int s = 0; s < QC_EDGE_SET_COUNT; s++)
        n += qc_graph_layer_num_edges(g, (enum qc_edge_set)s);
    return n;
}

/* Source offset of mode k's copy of the source nodes (pl2m: k·P, a2m: k·A). */
static int64_t mode_src_stride(const struct qc_graph *g, enum qc_edge_set s)
{
    return s == QC_EDGE_PL2M ? g->num_polygons : g->num_agents;
}

void qc_graph_layer_csr(const struct qc_graph *g, enum qc_edge_set s, int64_t *src, int64_t *dst,
                        int64_t *base, int64_t *dst_ptr)
{
    const struct qc_edges *e = &g->e[s];
    const int64_t K = g->num_modes, A = g->num_agents, E = e->num_edges;
    if (!is_expanded(s)) {
        if (src && E)
            memcpy(src, e->src, (size_t)E * sizeof(int64_t));
        if (dst && E)
            memcpy(dst, e->dst, (size_t)E * sizeof(int64_t));
        if (dst_ptr)
            memcpy(dst_ptr, e->dst_ptr, (size_t)(e->num_dst + 1) * sizeof(int64_t));
        for (int64_t i = 0; base && i < E; i++)
            base[i] = i;
        return;
    }
    int64_t o = 0;
    if (s == QC_EDGE_T2M) {
        /* layer dst a·K + k (agent-major): for each agent, K copies of its base edges */
        for (int64_t a = 0; a < A; a++) {
            for (int64_t k = 0; k < K; k++) {
                if (dst_ptr)
                    dst_ptr[a * K + k] = o;
                for (int64_t i = e->dst_ptr[a]; i < e->dst_ptr[a + 1]; i++, o++) {
                    if (src)
                        src[o] = e->src[i];
                    if (dst)
                        dst[o] = a * K + k;
                    if (base)
                        base[o] = i;
                }
            }
        }
    } else {
        /* layer dst k·A + a (mode-major): mode blocks of the base CSR, sources shifted */
        const int64_t ss = mode_src_stride(g, s);
        for (int64_t k = 0; k < K; k++) {
            for (int64_t a = 0; a < A; a++) {
                if (dst_ptr)
                    dst_ptr[k * A + a] = o;
                for (int64_t i = e->dst_ptr[a]; i < e->dst_ptr[a + 1]; i++, o++) {
                    if (src)
                        src[o] = e->src[i] + k * ss;
                    if (dst)
                        dst[o] = k * A + a;
                    if (base)
                        base[o] = i;
                }
            }
        }
    }
    if (dst_ptr)
        dst_ptr[K * A] = o;
}

void qc_graph_layer_official(const struct qc_graph *g, enum qc_edge_set s, int64_t *edge_index,
                             int64_t *base)
{
    const struct qc_edges *e = &g->e[s];
    const int64_t K = g->num_modes, A = g->num_agents, E = e->num_edges;
    const int64_t EL = qc_graph_layer_num_edges(g, s);
    int64_t *row0 = edge_index, *row1 = edge_index + EL;
    if (!is_expanded(s)) {
        for (int64_t i = 0; i < E; i++) {
            int64_t j = e->perm ? e->perm[i] : i;
            row0[j] = e->src[i];
            row1[j] = e->dst[i];
            if (base)
                base[j] = i;
        }
        return;
    }
    for (int64_t i = 0; i < E; i++) {
        int64_t j = e->perm ? e->perm[i] : i; /* official base position */
        if (s == QC_EDGE_T2M) {
            /* (a, t, k) order: each base edge repeated K times (repeat_interleave) */
            for (int64_t k = 0; k < K; k++) {
                row0[j * K + k] = e->src[i];
                row1[j * K + k] = e->dst[i] * K + k;
                if (base)
                    base[j * K + k] = i;
            }
        } else {
            /* K blocks of the base edges, k-major (torch.cat over modes) */
            const int64_t ss = mode_src_stride(g, s);
            for (int64_t k = 0; k < K; k++) {
                row0[k * E + j] = e->src[i] + k * ss;
                row1[k * E + j] = e->dst[i] + k * A;
                if (base)
                    base[k * E + j] = i;
            }
        }
    }
}

// ---- packing ---------------------------------------------------------------------------------

static size_t align64(size_t n)
{
    return (n + 63) / 64 * 64;
}

size_t qc_graph_packed_bytes(const struct qc_graph *g)
{
    size_t n = 0;
    for (int s = 0; s < QC_EDGE_SET_COUNT; s++) {
        const struct qc_edges *e = &g->e[s];
        size_t E = (size_t)e->num_edges;
        n += 2 * align64(E * sizeof(int64_t));
        n += align64((size_t)(e->num_dst + 1) * sizeof(int64_t));
        if (e->perm)
            n += align64(E * sizeof(int64_t));
        if (e->attr)
            n += align64(E * (size_t)e->num_feat * sizeof(float));
        if (e->type)
            n += align64(E);
    }
    return n;
}

static void *pack_copy(unsigned char **at, const void *src, size_t bytes)
{
    void *d = *at;
    if (bytes)
        memcpy(d, src, bytes);
    *at += align64(bytes);
    return d;
}

void qc_graph_pack(const struct qc_graph *g, void *mem, struct qc_graph *out)
{
    struct qc_graph tmp = *g;
    unsigned char *at = mem;
    for (int s = 0; s < QC_EDGE_SET_COUNT; s++) {
        struct qc_edges *e = &tmp.e[s];
        size_t E = (size_t)e->num_edges;
        e->src = pack_copy(&at, e->src, E * sizeof(int64_t));
        e->dst = pack_copy(&at, e->dst, E * sizeof(int64_t));
        e->dst_ptr = pack_copy(&at, e->dst_ptr, (size_t)(e->num_dst + 1) * sizeof(int64_t));
        if (e->perm)
            e->perm = pack_copy(&at, e->perm, E * sizeof(int64_t));
        if (e->attr)
            e->attr = pack_copy(&at, e->attr, E * (size_t)e->num_feat * sizeof(float));
        if (e->type)
            e->type = pack_copy(&at, e->type, E);
    }
    *out = tmp;
}
