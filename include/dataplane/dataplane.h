/*
 * dataplane: the umbrella header. Include this, or only the area you use:
 *   err.h     error codes and details (every call returns a dp_err)
 *   client.h  the key-value client over a cluster of storage units
 *   direct.h  the point-to-point transport (publish buffers, fetch them one-sided)
 */
#ifndef DATAPLANE_DATAPLANE_H
#define DATAPLANE_DATAPLANE_H

#include "dataplane/err.h"
#include "dataplane/client.h"
#include "dataplane/direct.h"

#endif
