/*
 * What the control server (ctl_server.c) and client (ctl_client.c) share:
 * CURVE key files and checks (see ctl.h), and reading a socket monitor's
 * events (ctl_int.h).
 */
#include "ctl/ctl_int.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

/* ---- CURVE keys ---- */

int
dp__ctl_key_read(const char *path, bool secret, char out[41], dp_detail *d)
{
    int fd = open(path, O_RDONLY | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return dp__fail_sys(d, errno, "key file %s", path);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dp__fail(d, DP_EINVAL, "key file %s is not a regular file", path);
    }
    if (secret && (st.st_mode & 077) != 0) {
        close(fd);
        return dp__fail(
            d, DP_EPOLICY,
            "secret key file %s is readable by others (mode %04o): chmod 600 %s", path,
            (unsigned)(st.st_mode & 07777), path);
    }
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0)
        return dp__fail_sys(d, errno, "read key file %s", path);
    buf[n] = '\0';
    /* One Z85 key of 40 characters; surrounding whitespace ignored. */
    char *p = buf;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    size_t len = strcspn(p, " \t\r\n");
    char *rest = p + len;
    while (*rest == ' ' || *rest == '\t' || *rest == '\n' || *rest == '\r')
        rest++;
    uint8_t bin[32];
    char z[41];
    if (len == 40) {
        memcpy(z, p, 40);
        z[40] = '\0';
    }
    if (len != 40 || *rest != '\0' || zmq_z85_decode(bin, z) == NULL)
        return dp__fail(d, DP_EINVAL,
                        "key file %s does not hold one CURVE key (40 Z85 characters, as "
                        "'dataplane keygen' writes)",
                        path);
    memcpy(out, z, 41);
    return DP_OK;
}

int
dp__ctl_key_public(const char secret[41], char out[41], dp_detail *d)
{
    if (zmq_curve_public(out, secret) != 0)
        return dp__fail(d, DP_EUNSUPPORTED,
                        "this libzmq has no CURVE (built without libsodium?)");
    return DP_OK;
}

int
dp__ctl_keypair(char pub[41], char secret[41], dp_detail *d)
{
    if (zmq_curve_keypair(pub, secret) != 0)
        return dp__fail(d, DP_EUNSUPPORTED,
                        "this libzmq has no CURVE (built without libsodium?)");
    return DP_OK;
}

bool
dp__ctl_key_valid(const char *z85)
{
    uint8_t bin[32];
    return z85 != NULL && strlen(z85) == 40 && zmq_z85_decode(bin, z85) != NULL;
}

/* ---- socket monitors ---- */

bool
dp__ctl_mon_recv(void *mon, uint16_t *ev, uint32_t *val)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return false;
    }
    *ev = 0;
    *val = 0;
    if (zmq_msg_size(&m) >= 2)
        memcpy(ev, zmq_msg_data(&m), sizeof *ev);
    if (zmq_msg_size(&m) >= 6)
        memcpy(val, (const uint8_t *)zmq_msg_data(&m) + 2, sizeof *val);
    bool more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    while (more) { /* the endpoint frame */
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    return true;
}
