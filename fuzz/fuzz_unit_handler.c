/*
 * libFuzzer target for the unit's control-message handler (src/unit/serve.c):
 * arbitrary bytes against a small in-process unit (no UCX, no ZMQ, fake
 * clock). The input is a script of records so the fuzzer can build state
 * (alloc, write a blob, commit, resolve, release...):
 *
 *   record = len: u16 little-endian, kind: u8, body: len - 1 bytes
 *   kind 0: body is one control message for dp__unit_handle
 *   kind 1: body is copied into the slab at the last offset an alloc returned
 *           (a client's WRITE), cut to the slab
 *   kind 2: the clock moves body[0] seconds and the ticker runs
 *   other:  body goes to the oversize handler
 *
 * A trailing partial record is fed to the handler as it is. After the script
 * the unit's own invariants must hold (dp__unit_check) and every reply must be
 * a well-formed msgpack reply.
 *
 * save_shard and load_shard messages are dropped before the handler (they
 * would create or read the files they name).
 *
 * The unit has the SSD tier on (a 64 KiB IO area, one io thread, files in a
 * temporary directory made once): alloc with spill, pending commits, stages
 * and evictions are reached too. The clock moves under the unit lock, as the
 * io thread reads it there.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blob/blob.h"
#include "unit/unit.h"
#include "wire/wire.h"

static double fuzz_t = 100.0;

static double
fuzz_now(void *ctx)
{
    (void)ctx;
    return fuzz_t;
}

static uint64_t last_off, last_token;
static char ssd_dir[] = "/tmp/dp-fuzz-unit-XXXXXX";

/* The unit's files are unlinked at once: only the directory is left. */
static void
rm_ssd_dir(void)
{
    rmdir(ssd_dir);
}

static void
feed(dp__unit *u, const uint8_t *msg, size_t len, dp__buf *out)
{
    dp__buf_reset(out);
    /*
     * save_shard and load_shard act on files the message names (the control
     * plane is trusted with paths): never let fuzz input create files. Their
     * file formats are exercised by test_checkpoint.
     */
    dp__wire_op op = DP_WIRE_OP_NONE;
    dp__wire_limits lim = dp__wire_limits_default;
    lim.max_msg = UINT64_MAX;
    dp__wire_str prid = {"", 0};
    dp__wire_request_peek(msg, len, &lim, &op, &prid, NULL);
    if (op == DP_WIRE_OP_SAVE_SHARD || op == DP_WIRE_OP_LOAD_SHARD)
        return;
    dp__unit_handle(u, msg, len, out);
    if (out->len == 0)
        return;
    /* Every reply carries a valid request id; remember alloc offsets. */
    dp__wire_str rid;
    if (dp__wire_reply_peek(out->data, out->len, NULL, &rid, NULL) != 0)
        abort();
    dp__wire_reply rep;
    if (dp__wire_reply_decode(out->data, out->len, DP_WIRE_OP_ALLOC, NULL, &rep, NULL) ==
            0 &&
        rep.ok)
        last_off = rep.r.alloc.off;
    last_token = rep.r.alloc.token;
    dp__wire_reply_fini(&rep);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    if (!quiet) {
        dp__log_set_level(DP_LOG_ERROR);
        if (mkdtemp(ssd_dir) == NULL) {
            perror("fuzz_unit_handler: mkdtemp");
            abort();
        }
        atexit(rm_ssd_dir);
        quiet = true;
    }
    dp__unit_opts o;
    dp__unit_opts_init(&o);
    o.slab_bytes = 64 * 1024;
    o.n_units = 2;
    o.unit_id = 0;
    o.read_pin_s = 10;
    o.alloc_lease_s = 30;
    o.quarantine_s = 5;
    o.numa = DP_UNIT_NUMA_OFF;
    o.now = fuzz_now;
    o.ssd_dir = ssd_dir;
    o.staging_bytes = 64 * 1024;
    o.pickup_s = 1;
    o.io_threads = 1;
    dp__unit *u = NULL;
    if (dp__unit_create(&o, &u, NULL) != 0)
        abort();
    last_off = 0;
    last_token = 0;
    dp__buf out;
    dp__buf_init(&out);
    size_t i = 0;
    while (i < size) {
        if (size - i < 3) {
            feed(u, data + i, size - i, &out);
            break;
        }
        size_t len = (size_t)data[i] | ((size_t)data[i + 1] << 8);
        uint8_t kind = data[i + 2];
        i += 3;
        size_t body = len > 0 ? len - 1 : 0;
        if (body > size - i)
            body = size - i;
        const uint8_t *p = data + i;
        i += body;
        switch (kind) {
        case 0:
            feed(u, p, body, &out);
            break;
        case 1: {
            /* last_off is in the put area or in the IO area */
            uint64_t end = last_off >= dp__unit_io_base(u) && dp__unit_io_bytes(u) > 0
                               ? dp__unit_io_base(u) + dp__unit_io_bytes(u)
                               : o.slab_bytes;
            uint64_t cap = last_off < end ? end - last_off : 0;
            memcpy(dp__unit_slab(u) + last_off, p, body < cap ? body : (size_t)cap);
            /* Name the last allocation, as a client does, so commits can publish. */
            if (body >= DP_BLOB_HEADER_LEN && cap >= DP_BLOB_HEADER_LEN)
                dp__blob_header_set_alloc(dp__unit_slab(u) + last_off,
                                          dp__unit_incarnation(u), last_token);
            break;
        }
        case 2:
            dp__unit_lock(u);
            fuzz_t += body > 0 ? p[0] : 1;
            dp__unit_unlock(u);
            dp__unit_tick(u);
            break;
        default:
            dp__buf_reset(&out);
            dp__unit_handle_oversize(u, p, body, &out);
            break;
        }
    }
    if (dp__unit_check(u, NULL) != 0)
        abort();
    dp__buf_fini(&out);
    dp__unit_destroy(u);
    return 0;
}
