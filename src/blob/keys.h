/*
 * Row keys: "<gidx>@<field>", e.g. "17@input_ids" (docs/design.md, "Overview").
 *
 * Keys arrive from untrusted places (blob indexes, control messages), so the
 * splitter takes bytes plus a length, never assumes a NUL terminator, and
 * accepts exactly one spelling of each key:
 *
 * - gidx: decimal digits only, no sign, no spaces, no leading zeros (except
 *   "0" itself), at most UINT64_MAX.
 * - '@': the key splits at the first '@'. A field can never contain '@', so a
 *   second '@' makes the key invalid ("1@a@b" is rejected).
 * - field: 1..255 bytes of valid UTF-8 (shortest encoding, no surrogates, at
 *   most U+10FFFF) without '@', without C0 control characters (U+0000..U+001F,
 *   so no NUL), DEL (U+007F) or C1 control characters (U+0080..U+009F).
 *   Everything else is allowed, including '/', '.', spaces and non-ASCII
 *   letters: a field is a name, never a path (spill files of the SSD tier have
 *   no name or a random one, docs/design.md "SSD tier"), so "obs/image" or ".." carry no
 * risk and rejecting them would only break users' field names.
 *
 * Every rejection is DP_EINVAL with a detail that quotes the key (bytes
 * outside printable ASCII shown as \xNN) and says what was wrong.
 *
 * Threads: every function here is reentrant.
 */
#ifndef DP_BLOB_KEYS_H
#define DP_BLOB_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dataplane/err.h"

/* Longest gidx spelling: UINT64_MAX has 20 digits. */
#define DP_GIDX_MAX_DIGITS 20
/* Longest field, in bytes. */
#define DP_FIELD_MAX 255
/* Longest key in bytes, without a terminating NUL: 20 + 1 + 255 = 276. */
#define DP_KEY_MAX (DP_GIDX_MAX_DIGITS + 1 + DP_FIELD_MAX)

/* A split key. field points into the key that was split (not NUL-terminated). */
typedef struct dp__key_parts {
    uint64_t gidx;
    const char *field;
    size_t field_len;
} dp__key_parts;

/*
 * Check that field[0..len) is a valid field name (rules above). Returns DP_OK
 * or DP_EINVAL with a detail. field need not be NUL-terminated.
 */
int dp__field_check(const char *field, size_t len, dp_detail *d);

/* dp__field_check without the detail. */
bool dp__field_valid(const char *field, size_t len);

/*
 * Parse a gidx spelled as s[0..len) (rules above). DP_EINVAL with a detail on
 * anything else, including overflow.
 */
int dp__gidx_parse(const char *s, size_t len, uint64_t *out, dp_detail *d);

/*
 * Make the key for (gidx, field[0..field_len)) into out[0..cap): the key's
 * bytes and a terminating NUL, its length (without the NUL) in *key_len
 * (NULL allowed). A buffer of DP_KEY_MAX + 1 bytes always suffices.
 * Returns DP_EINVAL if the field is invalid or cap is too small (out is then
 * left as an empty string when cap > 0).
 */
int dp__key_make(uint64_t gidx, const char *field, size_t field_len, char *out,
                 size_t cap, size_t *key_len, dp_detail *d);

/*
 * dp__key_make without the checks, for a caller that checked the field once
 * (dp__field_check) and makes many keys from it: out needs DP_KEY_MAX + 1
 * bytes. Returns the key's length.
 */
size_t dp__key_format(uint64_t gidx, const char *field, size_t field_len, char *out);

/*
 * Split key[0..len) into gidx and field. key need not be NUL-terminated; on
 * success parts->field points into key. Returns DP_EINVAL with a detail such
 * as "key '12x@a': gidx is not a decimal number".
 */
int dp__key_split(const char *key, size_t len, dp__key_parts *parts, dp_detail *d);

/*
 * dp__key_split of the NUL-terminated key, its length into *len: one pass
 * over the usual key (decimal gidx, '@', a printable ASCII field), the full
 * check for the rest.
 */
int dp__key_split_z(const char *key, size_t *len, dp__key_parts *parts, dp_detail *d);

/*
 * Internal: write s[0..len) into out[0..cap) (NUL-terminated) for an error
 * message: printable ASCII as is, other bytes as \xNN, '\'' and '\\' escaped,
 * cut with "..." when longer than max_shown input bytes. Returns out.
 */
const char *dp__quote_bytes(const char *s, size_t len, size_t max_shown, char *out,
                            size_t cap);

/*
 * Whether unit `unit` of n_units holds a copy of row gidx when the cluster keeps
 * `replicas` copies (0 counts as 1): the row's units are gidx % n_units and the
 * replicas - 1 after it, wrapping (docs/design.md, "Replicas").
 */
static inline bool
dp__row_on_unit(uint64_t gidx, uint32_t unit, uint32_t n_units, uint32_t replicas)
{
    uint32_t home = (uint32_t)(gidx % n_units);
    return (unit + n_units - home) % n_units < (replicas > 0 ? replicas : 1);
}

#endif
