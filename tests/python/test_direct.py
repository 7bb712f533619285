"""dataplane.Transport between two processes: a publisher subprocess hands its
metadata over a pipe, this process fetches."""

import gc
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import dataplane

PUBLISHER = textwrap.dedent(r"""
    import sys, numpy as np, torch, dataplane
    t = dataplane.Transport()
    objs = {
        "w1": [torch.arange(1 << 18, dtype=torch.float32),          # 1 MiB
               np.arange(12, dtype=np.int16).reshape(3, 4),
               torch.zeros(0, 3),                                  # empty
               torch.arange(5, dtype=torch.float32).to(torch.bfloat16),
               np.array([True, False, True, True, False, False, True]),
               torch.tensor(42, dtype=torch.int64)],               # 0-d
        "w2": [torch.arange(1000, dtype=torch.int64)],
        "w3": [torch.arange(1000, dtype=torch.int64) * 3],
        "be": [np.arange(5, dtype=">i4"), np.linspace(0, 1, 4).astype(">f8")],
        "cj": [torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()],
    }
    for k, v in objs.items():
        sys.stdout.write(k + " " + t.publish(k, v).hex() + "\n")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "free":
            t.free(arg)
        elif cmd == "quit":
            break
        sys.stdout.write("ok\n")
        sys.stdout.flush()
""")

W1 = [torch.arange(1 << 18, dtype=torch.float32),
      np.arange(12, dtype=np.int16).reshape(3, 4),
      torch.zeros(0, 3),
      torch.arange(5, dtype=torch.float32).to(torch.bfloat16),
      np.array([True, False, True, True, False, False, True]),
      torch.tensor(42, dtype=torch.int64)]


def _same(got, want):
    assert type(got) is type(want), (type(got), type(want))
    assert got.dtype == want.dtype
    assert tuple(got.shape) == tuple(want.shape)
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want)
    else:
        assert np.array_equal(got, want)


@pytest.fixture(scope="module")
def publisher():
    p = subprocess.Popen([sys.executable, "-c", PUBLISHER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    md = {}
    try:
        while True:
            line = p.stdout.readline()
            assert line, f"publisher exited with {p.wait()}"
            line = line.strip()
            if line == "ready":
                break
            k, h = line.split(" ")
            md[k] = bytes.fromhex(h)

        def cmd(c):
            p.stdin.write(c + "\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "ok"

        yield md, cmd
    finally:
        if p.poll() is None:
            try:
                p.stdin.write("quit\n")
                p.stdin.flush()
                p.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def transport():
    t = dataplane.Transport()
    yield t
    gc.collect()
    try:
        t.close()
    except dataplane.Busy:
        pass


def test_metadata_format(publisher):
    md, _ = publisher
    m = md["w1"]
    assert m[:8] == b"DPPYMD01"
    (n,) = struct.unpack_from("<I", m, 8)
    desc = json.loads(m[12:12 + n])
    assert [d[0] for d in desc] == ["torch", "numpy", "torch", "torch", "numpy", "torch"]
    assert desc[1] == ["numpy", "np_int16", [3, 4]]
    assert desc[5] == ["torch", "int64", []]


def test_fetch_without_out(publisher, transport):
    md, _ = publisher
    req = transport.fetch("w1", md["w1"])
    got = req.wait(timeout=30)
    assert req.done
    done, total = req.progress
    assert done == total == sum(x.numel() * x.element_size() if isinstance(x, torch.Tensor)
                                else x.nbytes for x in W1)
    assert len(got) == len(W1)
    for g, w in zip(got, W1):
        _same(g, w)
    # a second wait gives the same
    for g, w in zip(req.wait(timeout=30), W1):
        _same(g, w)


def test_fetch_into_out(publisher, transport):
    md, _ = publisher
    out = [torch.empty(1 << 18), np.zeros((3, 4), np.int16), torch.empty(0, 3),
           torch.zeros(5, dtype=torch.bfloat16), np.zeros(7, dtype=bool),
           torch.tensor(0, dtype=torch.int64)]
    req = transport.fetch("w1", md["w1"], out=out)
    got = req.wait(timeout=30)
    assert len(got) == len(out)
    for g, o, w in zip(got, out, W1):
        assert g is o
        _same(o, w)
    req.close()
    assert req.done


def test_fetch_out_wrong_sizes(publisher, transport):
    md, _ = publisher
    with pytest.raises(ValueError):
        transport.fetch("w2", md["w2"], out=[torch.empty(999, dtype=torch.int64)])
    with pytest.raises(ValueError):
        transport.fetch("w2", md["w2"], out=[])
    with pytest.raises(ValueError):
        transport.fetch("w2", md["w2"], out=[torch.empty(2000, dtype=torch.int64).t()[::2]])


def test_abort_makes_the_next_fetch_fail(publisher, transport):
    md, _ = publisher
    transport.abort("w2")
    with pytest.raises(dataplane.Canceled) as ei:
        req = transport.fetch("w2", md["w2"])
        req.wait(timeout=30)
    assert ei.value.code == dataplane._core.DP_ECANCELED
    # the mark is used once: the fetch after that one works
    req = transport.fetch("w2", md["w2"])
    got = req.wait(timeout=30)
    _same(got[0], torch.arange(1000, dtype=torch.int64))


def test_wrong_obj_id(publisher, transport):
    md, _ = publisher
    with pytest.raises(dataplane.InvalidArgument):
        transport.fetch("not-w2", md["w2"])


BAD_MD = {
    "garbage": b"garbage",
    "empty": b"",
    "bad magic": b"DPPYMD02" + b"\x02\x00\x00\x00[]",
    "truncated length": b"DPPYMD01\x01\x00",
    "length past end": b"DPPYMD01" + struct.pack("<I", 1000) + b"[]",
    "not json": b"DPPYMD01" + struct.pack("<I", 3) + b"{[}",
    "not utf-8": b"DPPYMD01" + struct.pack("<I", 2) + b"\xff\xfe",
    "not a list": b"DPPYMD01" + struct.pack("<I", 2) + b"{}",
    "bad origin": b"DPPYMD01" + struct.pack("<I", 25) + b'[["jax","float32",[2]]]   ',
    "bad dtype": b"DPPYMD01" + struct.pack("<I", 24) + b'[["torch","float8",[2]]]',
    "negative dim": b"DPPYMD01" + struct.pack("<I", 25) + b'[["torch","float32",[-2]]]',
    "library part garbage": b"DPPYMD01" + struct.pack("<I", 26)
    + b'[["torch","float32",[2]]]' + b"\x00junk",
}


@pytest.mark.parametrize("name", list(BAD_MD))
def test_malformed_metadata(transport, name):
    with pytest.raises(dataplane.ProtocolError) as ei:
        req = transport.fetch("w1", BAD_MD[name])
        req.wait(timeout=10)
    assert ei.value.code == dataplane._core.DP_EPROTO


def test_metadata_not_bytes(transport):
    with pytest.raises(TypeError):
        transport.fetch("w1", "a str")


def _retag(md, edit):
    (n,) = struct.unpack_from("<I", md, 8)
    desc = json.loads(md[12:12 + n])
    edit(desc)
    h = json.dumps(desc).encode()
    return b"DPPYMD01" + struct.pack("<I", len(h)) + h + md[12 + n:]


def test_description_disagreeing_with_transport_part(publisher, transport):
    """A description whose sizes or names do not match the library's part is
    malformed metadata too: ProtocolError, not a RuntimeError or KeyError from
    making the tensors."""
    md, _ = publisher

    def bigger(d):
        d[0][2] = [2 << 18]

    def wrong_origin_name(d):
        d[0][1] = "np_float32"  # a numpy name under origin "torch"

    for edit in (bigger, wrong_origin_name):
        with pytest.raises(dataplane.ProtocolError):
            req = transport.fetch("w1", _retag(md["w1"], edit))
            req.wait(timeout=30)


def test_big_endian_arrays_published(publisher, transport):
    """A big-endian array published must come back with its values."""
    md, _ = publisher
    got = transport.fetch("be", md["be"]).wait(timeout=30)
    assert np.array_equal(got[0], np.arange(5, dtype=np.int32))
    assert np.array_equal(got[1], np.linspace(0, 1, 4))


def test_conjugate_view_published(publisher, transport):
    """A lazily conjugated tensor is published with its values, not its raw
    (unconjugated) memory."""
    md, _ = publisher
    (got,) = transport.fetch("cj", md["cj"]).wait(timeout=30)
    assert torch.equal(got, torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))


def test_close_refused_while_fetches_live(publisher):
    md, _ = publisher
    t = dataplane.Transport()
    assert isinstance(t.name, str) and t.name
    out = [torch.empty(1000, dtype=torch.int64)]
    req = t.fetch("w3", md["w3"], out=out)
    req.wait(timeout=30)
    assert torch.equal(out[0], torch.arange(1000, dtype=torch.int64) * 3)
    with pytest.raises(dataplane.Busy):
        t.close()
    st = t.stats()
    assert st["fetches"] >= 1 and st["fetch_ok"] >= 1 and st["bytes_fetched"] >= 8000
    assert all(isinstance(v, int) for v in st.values())
    req.close()
    t.close()
    t.close()  # twice is fine
    with pytest.raises(dataplane.Closed):
        t.fetch("w3", md["w3"])


FETCH_THEN_CLOSE = textwrap.dedent(r"""
    import sys, torch, dataplane
    md1, md3 = (bytes.fromhex(x) for x in sys.stdin.read().split())
    t = dataplane.Transport()
    req = t.fetch("w1", md1)
    a = req.wait(timeout=30)[0]
    want = torch.arange(1 << 18, dtype=torch.float32)
    assert torch.equal(a, want)
    req.close()                      # documented: tensors it returned stay valid
    again = t.fetch("w1", md1)       # may reuse the memory the closed fetch had
    b = again.wait(timeout=30)[0]
    b.fill_(-1.0)
    print("SAME" if torch.equal(a, want) else "CHANGED", flush=True)
""")


def test_tensors_outlive_fetch_close(publisher):
    """FetchRequest.close() says the tensors it returned stay valid: reading
    them afterwards must neither crash nor see other data. Run in a
    subprocess, since the failure mode is a use-after-free."""
    md, _ = publisher
    p = subprocess.run([sys.executable, "-c", FETCH_THEN_CLOSE],
                       input=md["w1"].hex() + " " + md["w3"].hex(), capture_output=True,
                       text=True, timeout=60, env=os.environ.copy())
    assert p.returncode == 0 and p.stdout.strip() == "SAME", (
        f"rc {p.returncode}, stdout {p.stdout!r}, stderr tail {p.stderr[-1500:]!r}")


def test_publish_checks(transport):
    with pytest.raises(ValueError):
        transport.publish("nc", [torch.zeros(4, 4).t()])
    with pytest.raises(ValueError):
        transport.publish("nc2", [np.zeros((4, 4))[:, ::2]])
    with pytest.raises(TypeError):
        transport.publish("obj", [b"bytes"])
    with pytest.raises(ValueError, match="lazy zeros"):
        transport.publish("zt", [torch._efficientzerotensor(4, 4)[1:]])
    x = torch.arange(10)
    transport.publish("dup", [x])
    with pytest.raises(dataplane.Exists):
        transport.publish("dup", [x])
    transport.free("dup")


def _check_outcome(got):
    if isinstance(got, dataplane.Error):
        assert isinstance(got, (dataplane.Canceled, dataplane.Closed)), got
    else:
        for g, w in zip(got, W1):
            _same(g, w)


def test_close_while_another_thread_waits(publisher):
    """FetchRequest.close() from one thread while another waits on it: the
    waiter gets the fetch's outcome (done or Canceled), nothing is freed
    under it, and the Transport closes once the request is gone."""
    md, _ = publisher
    t = dataplane.Transport()
    for _ in range(5):
        req = t.fetch("w1", md["w1"])
        outcome = []

        def wait():
            try:
                outcome.append(req.wait(timeout=30))
            except dataplane.Error as e:
                outcome.append(e)

        th = threading.Thread(target=wait)
        th.start()
        req.close()
        th.join(30)
        assert not th.is_alive()
        assert len(outcome) == 1
        _check_outcome(outcome[0])
        req = outcome = None  # the fetched tensors keep their request alive
    gc.collect()
    t.close()


def test_transport_close_while_publishing_in_a_thread():
    t = dataplane.Transport()
    x = torch.randn(1 << 16)
    stop = threading.Event()
    errors = []

    def loop():
        i = 0
        while not stop.is_set():
            try:
                t.publish(f"o{i}", [x])
                t.free(f"o{i}")
            except dataplane.Closed:
                return
            except dataplane.Error as e:  # pragma: no cover - reported below
                errors.append(e)
                return
            i += 1

    th = threading.Thread(target=loop)
    th.start()
    time.sleep(0.05)
    for _ in range(200):
        try:
            t.close()
            break
        except dataplane.Busy:  # a publish is running: refused, t still usable
            time.sleep(0.001)
    stop.set()
    th.join(30)
    assert not errors, errors
    with pytest.raises(dataplane.Closed):
        t.publish("after", [x])


def test_register_for_good_and_drop_it_again():
    """register(x) keeps x's memory registered across objects; deregister(x)
    drops it at once when no object holds it, else when the last is freed."""
    t = dataplane.Transport()
    w = torch.randn(1000)
    t.register(w)
    assert t.stats()["registrations"] == 1
    md = t.publish("o1", [w[10:20]])  # inside: shares the registration
    assert t.stats()["registrations"] == 1 and isinstance(md, bytes)
    t.deregister(w)
    assert t.stats()["registrations"] == 1  # o1 still holds it
    t.free("o1")
    assert t.stats()["registrations"] == 0
    with pytest.raises(KeyError, match="no permanent registration"):
        t.deregister(w)
    with pytest.raises(ValueError):
        t.register(torch.empty(0))
    t.register(w)
    t.deregister(w)
    assert t.stats()["registrations"] == 0
    t.close()
