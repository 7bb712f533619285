"""The staging of device tensors (CUDA) in put and get(out=): chunk by chunk
through pinned, registered host memory. Debian's torch has no CUDA, so these
tests let the same pipeline stage CPU tensors (dataplane._device.STAGED gets
"cpu"; the copies are then synchronous): every chunk, the error that names
the rows earlier chunks landed, views of the destinations, copies counted.
The CUDA streams and events themselves run only where a GPU is."""

import numpy as np
import pytest
import torch

import dataplane
from dataplane import _device


@pytest.fixture
def staged_cpu(monkeypatch):
    monkeypatch.setattr(_device, "STAGED", ["cuda", "cpu"])
    monkeypatch.setattr(_device, "CHUNK_MIN", 64 << 10)  # small batches in chunks too


def test_chunks_cover_every_row():
    for n in list(range(0, 40)) + [1000, 4096]:
        for nbytes in (0, 1, 5 << 20, 100 << 20, 1 << 30, 10 << 30):
            parts = _device.chunks(n, nbytes)
            assert [i for a, b in parts for i in range(a, b)] == list(range(n))
            steps = {b - a for a, b in parts[:-1]}
            assert len(steps) <= 1 and (not steps or parts[-1][1] - parts[-1][0] <= min(steps))
            row = nbytes / n if n else 0
            if nbytes <= _device.CHUNKS * _device.CHUNK_MIN:
                assert 1 <= len(parts) <= _device.CHUNKS
            # few: rounding the rows to equal counts at most doubles them
            assert len(parts) <= 2 * max(_device.CHUNKS, -(-nbytes // _device.CHUNK_MAX))
            if n:  # a chunk moves at most CHUNK_MAX bytes, or one row
                assert max(b - a for a, b in parts) * row <= max(_device.CHUNK_MAX, row)


def test_put_and_get_out_through_staging(client, fresh_rows, staged_cpu):
    rows = list(fresh_rows(40))
    g = torch.Generator().manual_seed(3)
    a = torch.randn(40, 1024, generator=g)                       # 160 KiB: 2 chunks
    b = torch.randint(0, 1 << 30, (7, 40, 3), generator=g).permute(1, 2, 0)  # strided
    c = [bytes([i]) * (i + 1) for i in range(40)]                # a list field, sliced
    before = client.counters()["copied_bytes"]
    chunk_rows, put = [], client._put
    client._put = lambda r, *rest: (chunk_rows.append(len(r)), put(r, *rest))[1]
    hints = client.put(rows, {"a": a, "b": b, "c": c}, hints=True)
    del client._put
    assert len(chunk_rows) == 1 + 2 and sum(chunk_rows[1:]) == 40  # the call, 2 chunks
    assert client.counters()["copied_bytes"] - before == a.numel() * 4 + b.numel() * 8
    assert [len(hints[f]) for f in "abc"] == [40, 40, 40]
    keys = [f"{r}@{f}" for f in "abc" for r in rows]
    got = client.get_keys(keys, hints=[hints[f][i] for f in "abc" for i in range(40)])
    assert all(torch.equal(got[i], a[i]) for i in range(40))
    assert all(torch.equal(got[40 + i], b[i]) for i in range(40))
    assert got[80:] == c

    oa, ob = torch.zeros_like(a), torch.zeros(40, 3, 7, dtype=torch.int64)
    oc = [np.zeros(64, np.uint8) for _ in range(40)]
    res = client.get(rows, ["a", "b", "c"], out={"a": oa, "b": ob, "c": oc})
    assert torch.equal(oa, a) and torch.equal(ob, b)
    for i in range(40):  # views of the destinations, not of the staging memory
        assert res["a"][i].data_ptr() == oa[i].data_ptr() and torch.equal(res["a"][i], a[i])
        assert res["b"][i].data_ptr() == ob[i].data_ptr() and torch.equal(res["b"][i], b[i])
        assert bytes(res["c"][i]) == c[i]
    oa.zero_()
    st = client.get(rows, ["a"], out={"a": oa}, stack=True)
    assert st["a"] is oa and torch.equal(oa, a)


def test_staged_batches_bigger_than_the_ring(client, fresh_rows, staged_cpu, monkeypatch):
    """A batch of more chunks than the ring has slots: each slot is used
    again once its chunk has moved, the host memory stays SLOTS chunks big,
    and every row lands right both ways (jagged values included)."""
    monkeypatch.setattr(_device, "CHUNK_MAX", 64 << 10)
    rows = list(fresh_rows(200))
    g = torch.Generator().manual_seed(5)
    a = torch.randn(200, 1024, generator=g)  # 800 KiB: 13 chunks of 16 rows
    b = torch.randint(-100, 100, (200, 3), generator=g, dtype=torch.int16)
    parts = _device.chunks(200, 200 * (4096 + 6))
    assert len(parts) > _device.SLOTS
    client.put(rows, {"a": a, "b": b, "c": [bytes([i % 256]) for i in range(200)]})
    st = client._device_stage()
    step = parts[0][1] - parts[0][0]
    assert st.buf.numel() <= max(1 << 20, _device.SLOTS * (step * (4096 + 6) + 128))
    got = client.get_keys([f"{r}@a" for r in rows] + [f"{r}@b" for r in rows])
    assert all(torch.equal(got[i], a[i]) for i in range(200))
    assert all(torch.equal(got[200 + i], b[i]) for i in range(200))
    oa, ob = torch.zeros_like(a), torch.zeros_like(b)
    res = client.get(rows, ["a", "b", "c"], out={"a": oa, "b": ob,
                                                  "c": [np.zeros(4, np.uint8) for _ in rows]})
    assert torch.equal(oa, a) and torch.equal(ob, b)
    for i in (0, 15, 16, 63, 64, 199):
        assert res["a"][i].data_ptr() == oa[i].data_ptr() and torch.equal(res["a"][i], a[i])
        assert res["b"][i].data_ptr() == ob[i].data_ptr()
    oa.zero_()
    assert client.get(rows, ["a"], out={"a": oa}, stack=True)["a"] is oa
    assert torch.equal(oa, a)
    jag = [torch.arange(i % 7, dtype=torch.float64) for i in range(200)]  # some empty
    client.put(rows, {"j": jag})
    for per_row in (0, 1000):  # the masked write, the copies row by row
        monkeypatch.setattr(_device, "PER_ROW_MAX", per_row)
        oj = torch.full((200, 512), -1.0, dtype=torch.float64)  # 800 KiB: over the ring too
        res = client.get(rows, ["j"], out={"j": oj})["j"]
        for i, v in enumerate(res):
            assert torch.equal(v, jag[i]) and v.shape == (i % 7,)
            assert v.numel() == 0 or v.data_ptr() == oj[i].data_ptr()
            assert (oj[i, i % 7:] == -1).all()  # the rest of each row as it was
    ob = torch.zeros(200, 9, dtype=torch.bool)  # bool rows, shorter values
    bs = [torch.ones(i % 9, dtype=torch.bool) for i in range(200)]
    client.put(rows, {"bs": bs})
    monkeypatch.setattr(_device, "PER_ROW_MAX", 0)
    res = client.get(rows, ["bs"], out={"bs": ob})["bs"]
    assert all(torch.equal(v, bs[i]) for i, v in enumerate(res))
    assert int(ob.sum()) == sum(i % 9 for i in range(200))


def test_staged_lazy_zero_tensors(client, fresh_rows, staged_cpu):
    """torch's lazy zeros (no memory; a slice's data pointer is its offset)
    beside a staged batch, in every chunk: stored as zeros; as a staged
    destination: refused before anything moves."""
    rows = list(fresh_rows(40))
    a = torch.randn(40, 1024)  # 2 chunks
    z = torch._efficientzerotensor(41, 8)
    client.put(rows, {"a": a, "z": z[1:]})
    got = client.get(rows, ["a", "z"])
    assert all(torch.equal(got["a"][i], a[i]) for i in range(40))
    assert all(torch.equal(got["z"][i], torch.zeros(8)) for i in range(40))
    with pytest.raises(ValueError, match="no memory to write"):
        client.get(rows, ["a"], out={"a": torch._efficientzerotensor(41, 1024)[1:]})


def test_async_client_marks_without_cuda():
    """Without CUDA no marks are made and the call runs as it is."""
    assert _device.caller_marks([torch.zeros(2), [torch.zeros(1)]]) in (None, {})
    assert _device.after_marks(None, lambda x: x + 1, 1) == 2


def test_staged_get_of_jagged_values_into_one_destination(client, fresh_rows, staged_cpu):
    """Values shorter than the destination's rows land as views of their own
    shape at the start of each row."""
    rows = list(fresh_rows(30))
    vals = [torch.arange(i + 1, dtype=torch.float32) for i in range(30)]
    client.put(rows, {"j": vals})
    out = torch.full((30, 4096), -1.0)
    res = client.get(rows, ["j"], out={"j": out})["j"]
    for i, v in enumerate(res):
        assert v.shape == (i + 1,) and torch.equal(v, vals[i])
        assert v.data_ptr() == out[i].data_ptr()


def test_staged_put_failing_part_way_names_the_rows_that_landed(client, fresh_rows,
                                                               staged_cpu):
    rows = list(fresh_rows(40))
    a = torch.randn(40, 1024)
    bad = [b"x"] * 40
    bad[35] = object()  # found only when the last chunk is put
    with pytest.raises(dataplane.InvalidArgument) as e:
        client.put(rows, {"a": a, "bad": bad})
    landed = e.value.landed
    assert landed and landed == rows[:len(landed)] and sorted(e.value.rows) == rows[len(landed):]
    assert f"chunk from row {rows[len(landed)]}" in str(e.value)
    got = client.get(landed, ["a"])["a"]
    assert all(torch.equal(x, a[i]) for i, x in enumerate(got))
    with pytest.raises(KeyError):
        client.get(rows[len(landed):], ["a"])
    with pytest.raises(dataplane.InvalidArgument, match="appears twice"):
        client.put([rows[0], rows[1], rows[0]], {"a": a[:3]})
    with pytest.raises(ValueError, match="first dimension"):
        client.put(rows, {"a": a[:5]})


def test_staged_get_refusals(client, fresh_rows, staged_cpu):
    rows = list(fresh_rows(4))
    client.put(rows, {"a": torch.ones(4, 8)})
    with pytest.raises(ValueError, match="contiguous"):
        client.get(rows, ["a"], out={"a": torch.zeros(8, 4).t()})
    with pytest.raises(KeyError):
        client.get(rows + [rows[-1] + 1], ["a"], out={"a": torch.zeros(5, 8)})


def test_staged_get_names_the_missing_keys_of_every_chunk(client, fresh_rows, staged_cpu):
    """Keys missing from two chunks are all named; the chunks without a
    missing key are still written to out."""
    rows = list(fresh_rows(40))
    a = torch.randn(40, 1024)  # 160 KiB: 2 chunks of 20 rows
    client.put(rows, {"a": a})
    client.clear([rows[3], rows[37]])
    out = torch.zeros(40, 1024)
    with pytest.raises(dataplane.NotFound) as e:
        client.get(rows, ["a"], out={"a": out})
    assert sorted(e.value.keys) == sorted([f"{rows[3]}@a", f"{rows[37]}@a"])
    assert "2 key(s) not found" in str(e.value)
    with pytest.raises(dataplane.NotFound) as e:
        client.get(rows, ["a"], out={"a": out}, stack=True)
    assert len(e.value.keys) == 2
    client.put([rows[3]], {"a": a[3:4]})
    out.zero_()
    with pytest.raises(dataplane.NotFound) as e:  # only the second chunk misses one
        client.get(rows, ["a"], out={"a": out})
    assert e.value.keys == [f"{rows[37]}@a"]
    assert torch.equal(out[:20], a[:20])


def test_staged_calls_check_every_field_first(client, fresh_rows, staged_cpu):
    """Fields the chunks slice must have the batch's rows: nothing lands
    otherwise; a destination that is a lazy conjugate is refused before the
    get."""
    rows = list(fresh_rows(40))
    a = torch.randn(40, 1024)
    for bad in (np.zeros((41, 2)), [b"x"] * 45, [b"x"] * 39, torch.zeros(())):
        with pytest.raises(ValueError, match="40 rows are needed"):
            client.put(rows, {"a": a, "bad": bad})
    with pytest.raises(KeyError):
        client.get(rows[:1], ["a"])
    client.put(rows, {"a": a})
    with pytest.raises(ValueError, match="40 rows are needed"):
        client.get(rows, ["a", "b"], out={"a": torch.zeros_like(a), "b": np.zeros((9, 2))})
    z = torch.zeros(40, 512, dtype=torch.complex64)
    with pytest.raises(ValueError, match="conjugated"):
        client.get(rows, ["a"], out={"a": z.conj()})


def test_staging_memory_goes_with_its_client(cluster, staged_cpu):
    """No reference cycle: a client and its staging buffer go when the last
    reference does, even with the cyclic GC off."""
    import gc
    import weakref
    c = dataplane.Client(cluster, timeout_s=20)
    rows = [9_990_000 + i for i in range(4)]
    c.put(rows, {"a": torch.ones(4, 8)})
    c.clear(rows)
    buf = weakref.ref(c._stage.buf)
    gone = weakref.ref(c)
    gc.disable()
    try:
        c.close()
        del c
        assert gone() is None and buf() is None
    finally:
        gc.enable()
