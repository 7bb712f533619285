/*
 * `dataplane keygen --out PATH`: a CURVE key pair for the control plane:
 * PATH.key (the secret key, mode 0600) and PATH.pub (the public key). Units
 * take their secret with --curve-secret and allow clients by the .pub files
 * in their --curve-allow directory; clients take theirs from --curve-secret
 * or DP_CURVE_SECRET and a unit's public key from the cluster file or the
 * registry.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/common.h"
#include "common/fileio.h"
#include "ctl/ctl.h"

static const char usage_keygen[] =
    "usage: dataplane keygen --out PATH [--force]\n"
    "\n"
    "Make a CURVE key pair for the control plane: PATH.key holds the secret key\n"
    "(mode 0600: keep it to the process it identifies), PATH.pub the public key\n"
    "(give it to the peers: a unit's goes into the cluster file or registry, a\n"
    "client's into the units' --curve-allow directory). Refuses to overwrite\n"
    "existing files unless --force. Prints the public key.\n"
    "\n"
    "options:\n"
    "  --out PATH   where to write PATH.key and PATH.pub\n"
    "  --force      replace existing files\n"
    "  -h, --help   this text\n";

/* Write text to path (mode; O_EXCL unless force), fsynced. */
static int
write_key(const char *path, const char *text, mode_t mode, bool force, dp_detail *d)
{
    int fl = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (force ? O_TRUNC : O_EXCL);
    int fd = open(path, fl, mode);
    if (fd < 0) {
        if (errno == EEXIST)
            return dp__fail(d, DP_EEXIST, "%s exists: remove it, or give --force", path);
        return dp__fail_sys(d, errno, "create %s", path);
    }
    /* An existing file keeps its mode under O_TRUNC: set it. */
    int rc = fchmod(fd, mode) == 0 ? DP_OK : dp__fail_sys(d, errno, "chmod %s", path);
    if (rc == DP_OK)
        rc = dp__write_full(fd, text, strlen(text), 0, path, d);
    if (rc == DP_OK && fsync(fd) != 0)
        rc = dp__fail_sys(d, errno, "write %s", path);
    close(fd);
    return rc;
}

int
dp__cmd_keygen(int argc, char **argv)
{
    static const struct option opts[] = {{"out", required_argument, NULL, 'o'},
                                         {"force", no_argument, NULL, 'f'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *out = NULL;
    bool force = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 'f':
            force = true;
            break;
        case 'h':
            fputs(usage_keygen, stdout);
            return 0;
        default:
            return dp__cli_bad_option("keygen", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return dp__cli_unexpected("keygen", argv[optind]);
    if (out == NULL || out[0] == '\0')
        return dp__cli_usage("keygen", "--out PATH is required");
    char pub[41], sec[41], kpath[4096], ppath[4096], text[64];
    if (snprintf(kpath, sizeof kpath, "%s.key", out) >= (int)sizeof kpath ||
        snprintf(ppath, sizeof ppath, "%s.pub", out) >= (int)sizeof ppath)
        return dp__cli_usage("keygen", "--out path too long");
    dp_detail d;
    dp_detail_clear(&d);
    int rc = dp__ctl_keypair(pub, sec, &d);
    if (rc == DP_OK) {
        snprintf(text, sizeof text, "%s\n", sec);
        rc = write_key(kpath, text, 0600, force, &d);
        explicit_bzero(text, sizeof text);
    }
    explicit_bzero(sec, sizeof sec);
    if (rc == DP_OK) {
        snprintf(text, sizeof text, "%s\n", pub);
        rc = write_key(ppath, text, 0644, force, &d);
        if (rc != DP_OK)
            unlink(kpath); /* no half pair */
    }
    if (rc != DP_OK)
        return dp__cli_fail("keygen", rc, &d);
    printf("%s\n", pub);
    fprintf(stderr, "keygen: secret key %s (mode 0600), public key %s\n", kpath, ppath);
    return 0;
}
