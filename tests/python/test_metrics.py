"""Prometheus metrics of a unit (`dataplane unit --metrics`) and of a client
(`dataplane bench --metrics`), read with the real Prometheus text parser
(python3-prometheus-client) and, where it is installed, scraped by a real
Prometheus server started here on loopback and queried through its HTTP API
for a counter the test moved."""
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

import dataplane

# Units are separate programs: they do not get the sanitizer runtime this
# interpreter may have preloaded (scripts/pytest-asan.sh).
UNIT_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

prom_parser = pytest.importorskip("prometheus_client.parser")

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _cli():
    return os.environ.get("DP_CLI") or os.path.join(os.environ.get("DP_BUILD", "build"),
                                                    "dataplane")


def _port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _fetch(url, method="GET"):
    req = urllib.request.Request(url, method=method)
    try:
        with OPENER.open(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _families(text):
    return {f.name: f for f in prom_parser.text_string_to_metric_families(text)}


def _value(fams, family, sample, **labels):
    for s in fams[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{sample} {labels}")


def _said_url(path, pattern, proc, limit=15):
    """The URL a process wrote into its log file at path (pattern's group 1):
    port 0 lets it take a free port itself, where a port picked here first
    may be taken by another process before it binds (seen in CI)."""
    deadline = time.monotonic() + limit
    while True:
        m = re.search(pattern, open(path).read())
        if m:
            return m.group(1)
        assert proc.poll() is None and time.monotonic() < deadline, open(path).read()[-2000:]
        time.sleep(0.05)


@pytest.fixture
def unit(tmp_path):
    log = tmp_path / "unit.log"
    with open(log, "wb") as f:
        # info: the log line that names the metrics address (CI runs at warn)
        p = subprocess.Popen([_cli(), "unit", "--slab", "32M", "--metrics", "127.0.0.1:0"],
                             stdout=subprocess.PIPE, stderr=f, text=True,
                             env={**UNIT_ENV, "DP_LOG_LEVEL": "info"})
    addr = p.stdout.readline().strip()
    assert addr.startswith("tcp://"), f"{addr!r}: {open(log).read()[-2000:]}"
    base = _said_url(log, r"metrics: (http://[0-9.]+:[0-9]+)/metrics", p)
    # The metrics server is up before the address line is printed.
    assert _fetch(base + "/healthz")[0] == 200
    yield addr, base
    p.terminate()
    assert p.wait(15) == 0


def test_unit_metrics_parse_and_move(unit):
    addr, base = unit
    st, text = _fetch(base + "/metrics")
    assert st == 200
    assert "(undocumented)" not in text, "a stats row has no metric definition"
    fams = _families(text)
    # Units in the names, types as declared.
    for name, f in fams.items():
        assert name.startswith("dataplane_"), name
        if f.type == "counter":
            assert any(s.name.endswith("_total") for s in f.samples), name
    assert fams["dataplane_slab_bytes"].type == "gauge"
    assert _value(fams, "dataplane_slab_bytes", "dataplane_slab_bytes") == 32 << 20
    assert _value(fams, "dataplane_commits", "dataplane_commits_total") == 0

    vals = [np.full(1000 + i, i, dtype=np.uint8) for i in range(8)]
    with dataplane.Client([addr], timeout_s=10) as c:
        c.put(range(8), {"v": vals})
        got = c.get(range(8), ["v"])
        assert all(np.array_equal(a, b) for a, b in zip(vals, got["v"]))
        k = c.counters()
        assert k["puts"] == 1 and k["gets"] == 1
        # Which transports the data path uses (same host here: shared memory).
        assert "one-sided" in c.unit_path(0) or "two-sided" in c.unit_path(0)
        with pytest.raises(ValueError):
            c.unit_path(5)
        assert k["put_bytes"] == sum(v.nbytes for v in vals) == k["get_bytes"]
        c.clear(range(8))
        assert c.counters()["clears"] == 1

    fams = _families(_fetch(base + "/metrics")[1])
    vbytes = sum(v.nbytes for v in vals)
    assert _value(fams, "dataplane_commits", "dataplane_commits_total") == 1
    # 8 values of about 1 KB: the put came inline (its alloc, copy and commit in
    # one request), the get's values in the resolve_keys reply.
    assert _value(fams, "dataplane_allocs", "dataplane_allocs_total") == 1
    assert _value(fams, "dataplane_puts_inline", "dataplane_puts_inline_total") == 1
    assert _value(fams, "dataplane_inline_bytes", "dataplane_inline_bytes_total") == vbytes
    assert _value(fams, "dataplane_data_bytes", "dataplane_data_bytes_total",
                  direction="in") >= vbytes
    assert _value(fams, "dataplane_data_bytes", "dataplane_data_bytes_total",
                  direction="out") >= vbytes
    # Histograms: cumulative, +Inf == count, per op.
    h = fams["dataplane_op_duration_seconds"]
    assert h.type == "histogram"
    for op in ("put", "resolve_rows", "release_rows", "info"):
        buckets = [(s.labels["le"], s.value) for s in h.samples
                   if s.name.endswith("_bucket") and s.labels["op"] == op]
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), (op, buckets)
        assert buckets[-1][0] == "+Inf"
        n = _value(fams, "dataplane_op_duration_seconds",
                   "dataplane_op_duration_seconds_count", op=op)
        assert buckets[-1][1] == n >= 1, (op, n)

    assert _fetch(base + "/healthz")[0] == 200
    st, body = _fetch(base + "/nope")
    assert st == 404 and "/metrics" in body
    assert _fetch(base + "/metrics", method="POST")[0] == 405


def test_bench_serves_client_counters(unit, tmp_path):
    addr, _ = unit
    p = subprocess.Popen([_cli(), "bench", "--iters", "1000000", "--rows", "4", "--bytes", "4K",
                          "--metrics", "127.0.0.1:0", "--cluster", "/nonexistent"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**UNIT_ENV, "DP_CLUSTER": ""})
    # A cluster that does not exist: a clear error, no server left behind.
    _, err = p.communicate(timeout=30)
    assert p.returncode == 1 and "cluster" in err
    # With units: its counters move while it runs.
    with tempfile.TemporaryDirectory() as d:
        cf = os.path.join(d, "cluster.json")
        with open(cf, "w") as f:
            f.write('{"version": 1, "units": [{"id": 0, "zmq": "%s", "agent": "x"}]}' % addr)
        blog = tmp_path / "bench.log"
        with open(blog, "wb") as f:
            p = subprocess.Popen([_cli(), "bench", "--iters", "1000000", "--rows", "4",
                                  "--bytes", "4K", "--metrics", "127.0.0.1:0",
                                  "--cluster", cf],
                                 stdout=subprocess.DEVNULL, stderr=f, env=UNIT_ENV)
        try:
            url = _said_url(blog, r"metrics at (http://[0-9.]+:[0-9]+)/metrics", p)
            deadline = time.monotonic() + 30
            puts = 0
            while puts < 3:
                assert time.monotonic() < deadline, "bench's client counters did not move"
                try:
                    st, text = _fetch(url + "/metrics")
                    fams = _families(text)
                    puts = _value(fams, "dataplane_client_puts", "dataplane_client_puts_total")
                except (OSError, KeyError):
                    pass
                time.sleep(0.1)
            assert _value(fams, "dataplane_client_put_bytes",
                          "dataplane_client_put_bytes_total") >= puts * 4 * 4096 * 0.99
        finally:
            p.terminate()
            p.wait(15)


def test_a_real_prometheus_scrapes_a_unit(unit, tmp_path):
    prom = shutil.which("prometheus")
    if prom is None:
        pytest.skip("prometheus is not installed (scripts/deps.sh installs it)")
    addr, base = unit
    target = base[len("http://"):]
    port = _port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                   "scrape_configs:\n  - job_name: dataplane\n"
                   f"    static_configs:\n      - targets: ['{target}']\n")
    log = open(tmp_path / "prometheus.log", "wb")
    p = subprocess.Popen([prom, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path}/tsdb",
                          f"--web.listen-address=127.0.0.1:{port}"],
                         stdout=log, stderr=subprocess.STDOUT, env=UNIT_ENV)

    def query(q):
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        try:
            st, body = _fetch(url)
        except OSError:
            return None
        if st != 200:
            return None
        import json
        res = json.loads(body)["data"]["result"]
        return float(res[0]["value"][1]) if res else None

    def wait_for(q, want, limit=40):
        deadline = time.monotonic() + limit
        v = None
        while time.monotonic() < deadline:
            assert p.poll() is None, open(tmp_path / "prometheus.log").read()[-2000:]
            v = query(q)
            if v == want:
                return
            time.sleep(0.25)
        raise AssertionError(f"{q}: {v}, want {want}\n"
                             + open(tmp_path / "prometheus.log").read()[-2000:])

    try:
        wait_for('up{job="dataplane"}', 1.0)
        wait_for("dataplane_commits_total", 0.0)
        with dataplane.Client([addr], timeout_s=10) as c:
            c.put(range(3), {"v": [b"abc", b"de", b"f"]})
            c.put(range(3, 5), {"v": [b"xyz", b"w"]})
        wait_for("dataplane_commits_total", 2.0)
        # Small values: each put was one request (alloc, copy and commit).
        wait_for('sum(dataplane_op_duration_seconds_count{op="put"})', 2.0)
    finally:
        p.terminate()
        p.wait(15)
        log.close()
