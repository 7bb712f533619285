/*
 * CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78; the CRC of
 * iSCSI, ext4 and SSE4.2's crc32 instruction). crc32c("123456789") is
 * 0xE3069283.
 *
 * Values are finished CRCs: start from 0 and feed pieces in order,
 *     crc = dp__crc32c_update(0, a, na);
 *     crc = dp__crc32c_update(crc, b, nb);   (== dp__crc32c(a || b))
 *
 * dp__crc32c_update() picks, once per process, the SSE4.2 instruction when the
 * CPU has it (x86-64, runtime check; the library is not built with
 * -msse4.2) and a slicing-by-8 table otherwise. Both implementations are
 * exposed so tests and benchmarks can compare them.
 *
 * Threads: every function here is reentrant; the one-time setup is
 * thread-safe.
 */
#ifndef DP_BLOB_CRC32C_H
#define DP_BLOB_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Extend crc (a finished CRC32C, 0 for none yet) with p[0..n). p may be NULL if n == 0.
 */
uint32_t dp__crc32c_update(uint32_t crc, const void *p, size_t n);

/* CRC32C of p[0..n). */
uint32_t dp__crc32c(const void *p, size_t n);

/* The table-driven (slicing-by-8) implementation, on every CPU. */
uint32_t dp__crc32c_update_table(uint32_t crc, const void *p, size_t n);

/*
 * The SSE4.2 implementation (three interleaved streams for long buffers).
 * Where the CPU lacks it, this is the table implementation, so it is always
 * safe to call; dp__crc32c_hw_available() says which one runs.
 */
uint32_t dp__crc32c_update_hw(uint32_t crc, const void *p, size_t n);

/* True if this CPU runs dp__crc32c_update_hw() in hardware. */
bool dp__crc32c_hw_available(void);

/* "sse4.2" or "table": what dp__crc32c_update() uses on this CPU. */
const char *dp__crc32c_impl(void);

/*
 * The CRC32C of a || b from crc_a = crc32c(a), crc_b = crc32c(b) and the
 * length of b, without the bytes (lets several threads checksum pieces).
 */
uint32_t dp__crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

#endif
