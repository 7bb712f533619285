/*
 * dataplane: the umbrella header. Include this, or only the area you use:
 *   err.h         error codes and details (every call returns a dp_err), dp_free
 *   version.h     the version (generated from the build's project version)
 *   client.h      the key-value client over a cluster of storage units
 *   checkpoint.h  checkpoints of a cluster, over a client
 *   direct.h      the point-to-point transport (publish buffers, fetch them one-sided)
 */
#ifndef DATAPLANE_DATAPLANE_H
#define DATAPLANE_DATAPLANE_H

#include "dataplane/err.h"
#include "dataplane/version.h"
#include "dataplane/client.h"
#include "dataplane/checkpoint.h"
#include "dataplane/direct.h"

#endif
