/*
 * NUMA placement of a unit process: run on (and prefer or bind memory to)
 * node unit_id % nodes on multi-node machines; a no-op elsewhere.
 */
#include <errno.h>
#include <numa.h>
#include <stdio.h>
#include <string.h>

#include "unit/unit.h"

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
    int nodes = numa_num_configured_nodes();
    if (nodes <= 1) {
        snprintf(desc, cap, "one node: no-op");
        return;
    }
    int node = (int)(unit_id % (uint32_t)nodes);
    if (numa_run_on_node(node) != 0) {
        snprintf(desc, cap, "node %d: run_on_node failed (%s)", node, strerror(errno));
        return;
    }
    if (mode == DP_UNIT_NUMA_BIND) {
        struct bitmask *m = numa_allocate_nodemask();
        if (m != NULL) {
            numa_bitmask_setbit(m, (unsigned)node);
            numa_set_membind(m);
            numa_bitmask_free(m);
        }
        snprintf(desc, cap, "node %d of %d (bind)", node, nodes);
    } else {
        numa_set_preferred(node);
        snprintf(desc, cap, "node %d of %d (preferred)", node, nodes);
    }
}
