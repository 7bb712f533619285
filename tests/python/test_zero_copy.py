"""Registered memory (alloc, register): values in it move without staging
copies; plain memory is staged where a unit is reached over the network, and
copied straight between it and the unit's mapped slab where the unit is on
this host. Buffer lifetime rules."""

import gc

import numpy as np
import pytest
import torch

import dataplane


@pytest.fixture
def client(cluster, monkeypatch):
    """These tests count the data path's staging copies. Small values would
    travel inside the control messages instead (inline: test_inline.py), so
    that is off here. The units are on this host, where plain memory needs no
    staging (test_plain_memory_on_this_host_is_not_staged): this client takes
    the two-sided path (DP_TWO_SIDED=always, as over TCP to another host),
    where the staging rules apply."""
    monkeypatch.setenv("DP_TWO_SIDED", "always")
    c = dataplane.Client(cluster, timeout_s=20, inline_bytes=0)
    yield c
    c.close()


@pytest.fixture
def local_client(cluster):
    """A client on the default path to this host's units (their slabs mapped
    here: the memcpy path)."""
    c = dataplane.Client(cluster, timeout_s=20, inline_bytes=0)
    yield c
    c.close()


def test_plain_memory_on_this_host_is_not_staged(local_client, fresh_rows):
    """A unit on this host: plain (unregistered) memory is copied straight
    into its slab and out of it, with no staging copy, byte for byte; nothing
    is left touching it."""
    c = local_client
    rows = fresh_rows(6)
    t = torch.randn(6, 3000)
    lists = [np.arange(k * 100, dtype=np.int64) for k in range(1, 7)]
    put0, get0 = _staged(c)
    c.put(rows, {"pt": t, "pl": lists})
    assert _staged(c)[0] == put0
    out = torch.zeros(6, 3000)
    outl = [np.zeros_like(a) for a in lists]
    got = c.get(rows, ["pt", "pl"], out={"pt": out, "pl": outl})
    assert _staged(c)[1] == get0
    assert torch.equal(out, t)
    for a, b, g in zip(lists, outl, got["pl"]):
        assert np.array_equal(a, b) and np.array_equal(g, a)
    assert c.touches_unfinished(t) is False and c.touches_unfinished(out) is False
    # a view into the middle of a plain tensor, and a strided one (copied
    # first by the package, so never staged either)
    c.put(rows[:2], {"pv": [t[3, 7:1007], t[4, ::3]]})
    assert _staged(c)[0] == put0
    g = c.get(rows[:2], ["pv"])["pv"]
    assert torch.equal(g[0], t[3, 7:1007]) and torch.equal(g[1], t[4, ::3])


def _staged(c):
    k = c.counters()
    return k["staged_put_bytes"], k["staged_get_bytes"]


def test_counters_are_numbers(client):
    k = client.counters()
    for name in ("staged_put_bytes", "staged_get_bytes", "copied_bytes", "restarts_seen",
                 "rebinds", "units_down", "transfers_retained", "retained_bytes"):
        assert isinstance(k[name], int) and k[name] >= 0, name


def test_plain_put_is_staged(client, fresh_rows):
    rows = fresh_rows(4)
    t = torch.randn(4, 1000)
    put0, _ = _staged(client)
    client.put(rows, {"p": t})
    put1, _ = _staged(client)
    assert put1 - put0 == t.numel() * t.element_size()
    a = np.arange(300, dtype=np.int16)
    client.put(rows[:1], {"q": [a]})
    assert _staged(client)[0] - put1 == a.nbytes


def test_alloc_memory_moves_without_staging(client, fresh_rows):
    rows = fresh_rows(8)
    n, k = 8, 4096
    buf = client.alloc(n * k * 4)
    assert len(buf) == n * k * 4 and buf.address != 0
    src = torch.frombuffer(buf, dtype=torch.float32).view(n, k)
    src.copy_(torch.arange(n * k, dtype=torch.float32).view(n, k))
    put0, get0 = _staged(client)
    client.put(rows, {"z": src})                      # batch form
    client.put(rows[:2], {"zl": [src[5], src[6]]})    # list form
    assert _staged(client)[0] == put0

    out_buf = client.alloc(n * k * 4)
    out = torch.frombuffer(out_buf, dtype=torch.float32).view(n, k)
    got = client.get(rows, ["z"], out={"z": out})["z"]
    assert _staged(client)[1] == get0
    assert torch.equal(out, src)
    for i in range(n):
        assert got[i].data_ptr() == out[i].data_ptr()
        assert torch.equal(got[i], src[i])
    got = client.get(rows[:2], ["zl"], out={"zl": [out[0], out[1]]})["zl"]
    assert torch.equal(got[0], src[5]) and torch.equal(got[1], src[6])
    assert _staged(client)[1] == get0


def test_alloc_numpy_view(client, fresh_rows):
    rows = fresh_rows(3)
    buf = client.alloc(3 * 100 * 8)
    a = np.frombuffer(buf, dtype=np.float64).reshape(3, 100)
    a[...] = np.arange(300).reshape(3, 100) * 0.5
    put0, get0 = _staged(client)
    client.put(rows, {"a": a})
    assert _staged(client)[0] == put0
    got = client.get(rows, ["a"])["a"]
    for i in range(3):
        assert got[i].dtype == np.float64 and np.array_equal(got[i], a[i])


def test_plain_get_into_out_is_staged(client, fresh_rows):
    """The reverse check: a get into ordinary memory goes through staging, so
    the counter the zero-copy test watches does move."""
    rows = fresh_rows(2)
    t = torch.randn(2, 512)
    client.put(rows, {"s": t})
    _, get0 = _staged(client)
    out = torch.zeros(2, 512)
    client.get(rows, ["s"], out={"s": out})
    assert torch.equal(out, t)
    assert _staged(client)[1] - get0 == t.numel() * t.element_size()


def test_registered_tensor_moves_without_staging(client, fresh_rows):
    rows = fresh_rows(4)
    t = torch.randn(4, 2048)
    client.register(t)
    try:
        put0, get0 = _staged(client)
        client.put(rows, {"r": t})
        assert _staged(client)[0] == put0
        out = torch.zeros(4, 2048)
        client.register(out)
        try:
            client.get(rows, ["r"], out={"r": out})
            assert _staged(client)[1] == get0
            assert torch.equal(out, t)
        finally:
            client.deregister(out)
        assert client.touches_unfinished(t) is False
    finally:
        client.deregister(t)
    # deregistered: a put is staged again
    put1, _ = _staged(client)
    client.put(rows, {"r": t})
    assert _staged(client)[0] - put1 == t.numel() * t.element_size()
    with pytest.raises(dataplane.NotFound):
        client.deregister(t)


def test_registered_numpy_array(client, fresh_rows):
    rows = fresh_rows(2)
    a = np.arange(2 * 1000, dtype=np.int32).reshape(2, 1000)
    client.register(a)
    try:
        put0, _ = _staged(client)
        client.put(rows, {"n": a})
        assert _staged(client)[0] == put0
        got = client.get(rows, ["n"])["n"]
        assert np.array_equal(got[0], a[0]) and np.array_equal(got[1], a[1])
    finally:
        client.deregister(a)


def test_register_refuses_non_contiguous(client):
    with pytest.raises(ValueError):
        client.register(torch.zeros(4, 4).t())
    with pytest.raises(ValueError):
        client.register(np.zeros((4, 4))[:, ::2])
    with pytest.raises(TypeError):
        client.register(b"bytes")


def test_alloc_bad_sizes(client):
    with pytest.raises(dataplane.InvalidArgument):
        client.alloc(0)
    with pytest.raises(dataplane.InvalidArgument):
        client.alloc(-5)


def test_buffer_release_refused_while_numpy_view_lives(client):
    buf = client.alloc(4096)
    a = np.frombuffer(buf, dtype=np.uint8)
    a[:] = 9
    with pytest.raises(BufferError):
        buf.release()
    assert int(a.sum()) == 9 * 4096  # still valid
    del a
    gc.collect()
    buf.release()
    assert buf.address == 0 and len(buf) == 0
    with pytest.raises(BufferError):
        np.frombuffer(buf, dtype=np.uint8)
    buf.release()  # twice is fine


def test_buffer_release_refused_while_memoryview_lives(client):
    buf = client.alloc(128)
    m = memoryview(buf)
    with pytest.raises(BufferError):
        buf.release()
    m.release()
    buf.release()
    assert buf.address == 0


def test_buffer_release_refused_while_torch_view_lives(client):
    """torch.frombuffer is the documented way to use alloc() memory; release()
    must not free the memory under a live tensor (a use-after-free)."""
    buf = client.alloc(4096)
    t = torch.frombuffer(buf, dtype=torch.float32)
    t.fill_(1.0)
    try:
        with pytest.raises(BufferError):
            buf.release()
    finally:
        released = buf.address == 0
        if released:  # the bug: t points at freed memory; never touch it again
            t = None
    assert float(t.sum()) == 1024.0
    del t
    gc.collect()
    buf.release()
