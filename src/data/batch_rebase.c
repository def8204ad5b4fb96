/*
 * batch_rebase.c — a device view of a collated batch (qc_batch_rebase, qc_batch.h): the same
 * struct with every array pointer moved from the batch's two host storage blocks (node_mem,
 * graph_mem) onto the device copies of those blocks.
 *
 * Invariant: for every array field f, view.f − dev_block == batch.f − host_block, where the
 * block is the one holding batch.f (the node block for the node fields, the graph block for the
 * packed graph of qc_graph_pack). A zero-length array may point one past the end of its block
 * (the packers hand out that address for empty arrays); it is moved like the others.
 */
#include "qc_batch.h"

#include <stdint.h>
#include <string.h>

#include "qc_graph.h"
#include "qc_status.h"

struct rebase {
    uintptr_t node, node_end, graph, graph_end; /* host blocks [start, end) */
    unsigned char *node_dev, *graph_dev;
};

/* p moved from its host block onto the matching device block; NULL stays NULL. */
static void *move(const struct rebase *r, const void *p, const char *field)
{
    if (!p)
        return NULL;
    const uintptr_t a = (uintptr_t)p;
    /* strictly inside a block first, then one past its end (an empty array) */
    if (r->node_dev && a >= r->node && a < r->node_end)
        return r->node_dev + (a - r->node);
    if (r->graph_dev && a >= r->graph && a < r->graph_end)
        return r->graph_dev + (a - r->graph);
    if (r->node_dev && a == r->node_end)
        return r->node_dev + (a - r->node);
    if (r->graph_dev && a == r->graph_end)
        return r->graph_dev + (a - r->graph);
    QC_ASSERT(false,
              "batch rebase: %s (%p) is outside the node block %p (+%zu) and the graph "
              "block %p (+%zu)",
              field, p, (void *)r->node, (size_t)(r->node_end - r->node), (void *)r->graph,
              (size_t)(r->graph_end - r->graph));
    return NULL;
}

#define MOVE(field) view->field = move(&r, batch->field, #field)

void qc_batch_rebase(const struct qc_batch *batch, void *node_dev, void *graph_dev,
                     struct qc_batch *view)
{
    struct rebase r;
    memset(&r, 0, sizeof r);
    if (batch->node_mem) {
        r.node = (uintptr_t)batch->node_mem;
        r.node_end = r.node + batch->node_bytes;
        r.node_dev = node_dev;
    }
    if (batch->graph_mem) {
        r.graph = (uintptr_t)batch->graph_mem;
        r.graph_end = r.graph + batch->graph_bytes;
        r.graph_dev = graph_dev;
    }
    QC_ASSERT(!batch->node_mem || node_dev, "batch rebase: the node block has no device copy");
    QC_ASSERT(!batch->graph_mem || graph_dev, "batch rebase: the graph block has no device copy");
    *view = *batch; /* counts, has_graph, graph counts and build times */

    // ---- node fields
    MOVE(agent_ptr);
    MOVE(pl_ptr);
    MOVE(pt_ptr);
    MOVE(pl2pl_ptr);
    MOVE(av_index);
    MOVE(scene_index);
    MOVE(scenario_id);
    MOVE(city);
    MOVE(valid_mask);
    MOVE(predict_mask);
    MOVE(agent_type);
    MOVE(agent_category);
    MOVE(position);
    MOVE(heading);
    MOVE(velocity);
    MOVE(target);
    MOVE(agent_batch);
    MOVE(agent_id);
    MOVE(pl_position);
    MOVE(pl_orientation);
    MOVE(pl_height);
    MOVE(pl_type);
    MOVE(pl_is_intersection);
    MOVE(pl_batch);
    MOVE(pt_position);
    MOVE(pt_orientation);
    MOVE(pt_magnitude);
    MOVE(pt_height);
    MOVE(pt_type);
    MOVE(pt_side);
    MOVE(pt_batch);
    MOVE(pt2pl);
    MOVE(pl2pl_edge);
    MOVE(pl2pl_type);

    // ---- the packed graph (every pointer qc_graph_pack sets)
    for (int s = 0; s < QC_EDGE_SET_COUNT; s++) {
        MOVE(graph.e[s].src);
        MOVE(graph.e[s].dst);
        MOVE(graph.e[s].dst_ptr);
        MOVE(graph.e[s].perm);
        MOVE(graph.e[s].attr);
        MOVE(graph.e[s].type);
    }

    // ---- storage: the view owns nothing
    memset(&view->alloc, 0, sizeof view->alloc);
    view->node_mem = NULL;
    view->node_bytes = 0;
    view->graph_mem = NULL;
    view->graph_bytes = 0;
}
