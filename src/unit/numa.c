/*
 * NUMA placement of a unit process: run on (and prefer or bind memory to)
 * the (unit_id % n)-th of the n nodes this process may allocate on, on
 * multi-node machines; a no-op elsewhere. Node ids may be sparse (a node
 * without memory, or outside the cpuset, is skipped), so the node is picked
 * by its rank among the allowed ones, never as unit_id % the configured count.
 */
#include <errno.h>
#include <stdbool.h>
#include <numa.h>
#include <stdio.h>
#include <string.h>

#include "unit/unit.h"

/* The rank-th node set in nodes (0-based), -1 if there are fewer. */
static int
nth_node(const struct bitmask *nodes, int rank)
{
    for (int i = 0; i <= numa_max_node(); i++)
        if (numa_bitmask_isbitset(nodes, (unsigned)i) && rank-- == 0)
            return i;
    return -1;
}

/* Bind this thread's memory to node alone; true if the kernel took it. */
static bool
bind_to(int node)
{
    struct bitmask *m = numa_allocate_nodemask();
    if (m == NULL)
        return false;
    numa_bitmask_setbit(m, (unsigned)node);
    numa_set_membind(m); /* reports through numa_error only: checked below */
    numa_bitmask_free(m);
    struct bitmask *got = numa_get_membind();
    bool ok = got != NULL && numa_bitmask_isbitset(got, (unsigned)node) &&
              numa_bitmask_weight(got) == 1;
    if (got != NULL)
        numa_bitmask_free(got);
    return ok;
}

void
dp__unit_numa_apply(dp__unit_numa mode, uint32_t unit_id, char *desc, size_t cap)
{
    if (mode == DP_UNIT_NUMA_OFF) {
        snprintf(desc, cap, "off");
        return;
    }
    if (numa_available() < 0) {
        snprintf(desc, cap, "no NUMA support: no-op");
        return;
    }
    struct bitmask *allowed = numa_get_mems_allowed();
    int nodes = allowed != NULL ? (int)numa_bitmask_weight(allowed) : 0;
    if (nodes <= 1) {
        if (allowed != NULL)
            numa_bitmask_free(allowed);
        snprintf(desc, cap, "one node: no-op");
        return;
    }
    int node = nth_node(allowed, (int)(unit_id % (uint32_t)nodes));
    numa_bitmask_free(allowed);
    if (node < 0 || numa_run_on_node(node) != 0) {
        snprintf(desc, cap, "node %d: run_on_node failed (%s)", node,
                 node < 0 ? "no such node" : strerror(errno));
        return;
    }
    if (mode == DP_UNIT_NUMA_BIND) {
        if (bind_to(node)) {
            snprintf(desc, cap, "node %d of %d (bind)", node, nodes);
        } else {
            numa_set_preferred(node);
            snprintf(desc, cap, "node %d of %d (bind failed: memory preferred there)",
                     node, nodes);
        }
    } else {
        numa_set_preferred(node);
        snprintf(desc, cap, "node %d of %d (preferred)", node, nodes);
    }
}
