"""close, context manager, values and memory outliving the client, fork."""

import gc
import os

import numpy as np
import pytest
import torch

import dataplane


def _calls(c, rows):
    """Every Client call, each a thunk."""
    return {
        "put": lambda: c.put(rows, {"x": [b"v"] * len(rows)}),
        "put_batch": lambda: c.put(rows, {"x": torch.zeros(len(rows), 2)}),
        "put_noncontig": lambda: c.put(rows, {"x": torch.zeros(2, len(rows)).t()}),
        "get": lambda: c.get(rows, ["x"]),
        "get_out": lambda: c.get(rows, ["x"], out={"x": torch.zeros(len(rows), 2)}),
        "get_keys": lambda: c.get_keys([f"{rows[0]}@x"]),
        "clear": lambda: c.clear(rows),
        "stats": lambda: c.stats(),
        "counters": lambda: c.counters(),
        "alloc": lambda: c.alloc(64),
        "register": lambda: c.register(torch.zeros(16)),
        "n_units": lambda: c.n_units,
        "unit_address": lambda: c.unit_address(0),
    }


def test_calls_after_close_raise_closed(cluster, fresh_rows):
    rows = fresh_rows(2)
    c = dataplane.Client(cluster, timeout_s=20)
    c.put(rows, {"x": [b"a", b"b"]})
    assert not c.closed
    c.close()
    assert c.closed
    c.close()  # twice is fine
    for name, call in _calls(c, rows).items():
        with pytest.raises(dataplane.Closed) as ei:
            call()
        assert ei.value.code == dataplane._core.DP_ECLOSED, name
        assert ei.value.name == "DP_ECLOSED"


def test_values_outlive_close(cluster, fresh_rows):
    rows = fresh_rows(3)
    c = dataplane.Client(cluster, timeout_s=20)
    t = torch.arange(3 * 4096, dtype=torch.float64).view(3, 4096)
    a = np.arange(30, dtype=np.int16).reshape(3, 10)
    c.put(rows, {"t": t, "a": a, "b": [b"x", b"yy", b"zzz"]})
    got = c.get(rows, ["t", "a", "b"])
    keyed = c.get_keys([f"{rows[1]}@t"])
    c.close()
    gc.collect()
    for i in range(3):
        assert torch.equal(got["t"][i], t[i])
        assert np.array_equal(got["a"][i], a[i])
    assert got["b"] == [b"x", b"yy", b"zzz"]
    assert torch.equal(keyed[0], t[1])
    got["t"][0].add_(1)  # still writable memory
    assert torch.equal(got["t"][0], t[0] + 1)


def test_alloc_memory_outlives_close(cluster):
    c = dataplane.Client(cluster, timeout_s=20)
    buf = c.alloc(1 << 16)
    a = np.frombuffer(buf, dtype=np.uint32)
    a[:] = np.arange(a.size, dtype=np.uint32)
    c.close()
    assert c.closed
    with pytest.raises(dataplane.Closed):
        c.get([1], ["x"])
    assert np.array_equal(a, np.arange(a.size, dtype=np.uint32))
    a[0] = 77  # still writable
    assert a[0] == 77
    del a
    buf.release()  # the last buffer: the pending close completes
    del buf
    gc.collect()


def test_context_manager_closes(cluster, fresh_rows):
    rows = fresh_rows(1)
    with dataplane.Client(cluster, timeout_s=20) as c:
        assert not c.closed
        c.put(rows, {"cm": [b"in"]})
        assert c.get(rows, ["cm"])["cm"] == [b"in"]
    assert c.closed
    with pytest.raises(dataplane.Closed):
        c.get(rows, ["cm"])
    with pytest.raises(RuntimeError):
        with dataplane.Client(cluster, timeout_s=20) as c2:
            raise RuntimeError("boom")
    assert c2.closed


def test_many_clients_open_and_close(cluster, fresh_rows):
    rows = fresh_rows(1)
    for i in range(5):
        with dataplane.Client(cluster, timeout_s=20) as c:
            c.put(rows, {"n": [bytes([i])]})
            assert c.get(rows, ["n"])["n"] == [bytes([i])]


def test_fork_child_gets_closed(client, fresh_rows):
    rows = fresh_rows(2)
    client.put(rows[:1], {"x": [b"parent"]})
    calls = _calls(client, rows)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no torch, no cleanup, os._exit only
        code = 0
        try:
            os.close(r)
            bad = []
            for name in ("put", "get", "get_keys", "clear", "stats", "counters", "alloc",
                         "n_units", "unit_address"):
                try:
                    calls[name]()
                    bad.append(f"{name}: no error")
                except dataplane.Closed as e:
                    if "fork" not in str(e) and "process" not in str(e):
                        bad.append(f"{name}: unhelpful message {e}")
                except BaseException as e:  # noqa: BLE001
                    bad.append(f"{name}: {type(e).__name__}: {e}")
            try:
                client.close()  # allowed: frees nothing of the parent's
            except BaseException as e:  # noqa: BLE001
                bad.append(f"close: {type(e).__name__}: {e}")
            os.write(w, "\n".join(bad).encode()[:4000])
            code = 3 if bad else 0
        except BaseException:  # noqa: BLE001
            code = 4
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        report = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, report
    # the parent's client is untouched by the child
    assert not client.closed
    assert client.get(rows[:1], ["x"])["x"] == [b"parent"]
    client.put(rows[1:], {"x": torch.ones(1, 3)})
    assert torch.equal(client.get(rows[1:], ["x"])["x"][0], torch.ones(3))
