/*
 * Internals of the cluster checkpoints shared by their files (not
 * installed): checkpoint.c (what save and load share, the public save and
 * load), checkpoint_save.c (the save) and checkpoint_load.c (load, peek,
 * re-home). checkpoint.h is the internal side's interface, with the layout
 * and the crash guarantees.
 */
#ifndef DP_CLIENT_CHECKPOINT_INT_H
#define DP_CLIENT_CHECKPOINT_INT_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "client/checkpoint.h"
#include "client/fanout.h"
#include "wire/wire.h"

/* A progress line through o->progress (nothing without one). */
void dp__ckpt_say(const dp_ckpt_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Format a path into out[cap]; DP_EINVAL if it does not fit. */
int dp__ckpt_pathf(char *out, size_t cap, dp_detail *d, const char *fmt, ...);

/* dir made absolute (not resolved further) into out. */
int dp__ckpt_abs_dir(const char *dir, char *out, size_t cap, dp_detail *d);

/* CRC32C and size of a whole file. */
int dp__ckpt_file_crc(const char *path, uint32_t *crc, uint64_t *size, dp_detail *d);

/*
 * What every checkpoint call does first: the caller's options (NULL: the
 * defaults) with each 0 replaced by its default, checked, into *defo (*o then
 * points there); a zeroed summary; dir made absolute into adir.
 */
int dp__ckpt_begin(const dp_ckpt_opts **o, dp_ckpt_opts *defo, dp_ckpt_summary *sum,
                   const char *dir, char adir[PATH_MAX], dp_detail *d);

/*
 * The request of every unit of cl, sent at once through the fanout f (reset
 * first): q_of fills unit i's; an encoding failure goes into d (with what).
 */
int dp__ckpt_ask_units(dp__fanout *f, dp__wire_rid_gen *g, const dp__cluster *cl,
                       dp__fanout_req_fn q_of, void *ctx, dp_detail *d);

/* The fanout's first failure into d, under what ("checkpoint save"). */
int dp__ckpt_units_failed(const dp__fanout *f, const char *what, dp_detail *d);

#endif
