"""CUDA tensors in put and get(out=), on a real GPU: staged through pinned,
registered host memory with the device copies on the client's side stream
(docs/design.md, "Device tensors"). Skipped where torch has no CUDA (Debian's
torch); test_device.py drives the same pipeline with CPU tensors there.

Every check compares content: on the GPU with torch.equal, or against the
CPU copy the test kept."""

import asyncio

import numpy as np
import pytest
import torch

import dataplane
from dataplane import _device

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA here")

DEV = "cuda"


def _slow_fill(t, value, stream):
    """On stream: a kernel that keeps the GPU busy for a while, then t filled
    with value: a copy that does not wait for stream reads the old bytes."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)  # about 25 ms at 2 GHz
        t.fill_(value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int8, torch.uint8, torch.bool, torch.complex64])
def test_batch_round_trip_every_dtype(client, fresh_rows, dtype):
    rows = list(fresh_rows(33))
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(33, 5, 7, device=DEV, generator=g) * 50
    if dtype == torch.bool:
        x = x > 0
    elif dtype == torch.complex64:
        x = torch.complex(x, -x)
    x = x.to(dtype)
    client.put(rows, {"x": x})
    got = client.get(rows, ["x"])["x"]  # no out=: host tensors, as the C library returns
    ref = x.cpu()
    assert all(v.dtype == dtype and v.device.type == "cpu" and torch.equal(v, ref[i])
               for i, v in enumerate(got))
    out = torch.empty_like(x)
    res = client.get(rows, ["x"], out={"x": out})["x"]
    assert torch.equal(out, x)
    assert all(v.device == out.device and v.data_ptr() == out[i].data_ptr() for i, v in enumerate(res))


def test_large_batch_through_more_chunks_than_the_ring(client, fresh_rows):
    """160 MiB: 5 chunks of 32 MiB through a ring of 2 slots, both ways."""
    rows = list(fresh_rows(40))
    x = torch.randint(-2**31, 2**31 - 1, (40, 1 << 20), device=DEV, dtype=torch.int32)
    assert len(_device.chunks(40, x.numel() * 4)) > _device.SLOTS
    before = client.counters()["copied_bytes"]
    client.put(rows, {"x": x})
    assert client.counters()["copied_bytes"] - before == x.numel() * 4  # one copy, D2H
    out = torch.zeros_like(x)
    client.get(rows, ["x"], out={"x": out})
    assert torch.equal(out, x)
    st = client.get(rows, ["x"], out={"x": torch.zeros_like(x)}, stack=True)["x"]
    assert st.device == x.device and torch.equal(st, x)
    assert client._device_stage().buf.numel() <= _device.SLOTS * _device.CHUNK_MAX + (1 << 20)


def test_strided_conjugated_and_negated_views(client, fresh_rows):
    rows = list(fresh_rows(16))
    base = torch.randn(3, 16, 64, device=DEV)
    p = base.permute(1, 2, 0)  # not contiguous
    c = torch.complex(base[0], base[1]).conj()  # a lazy conjugation
    n = base[2].neg()  # torch may keep this lazy (is_neg) or not: both must land right
    client.put(rows, {"p": p, "c": c, "n": n})
    got = client.get_keys([f"{r}@{f}" for f in "pcn" for r in rows])
    ref = [p.cpu(), c.resolve_conj().cpu(), n.cpu()]
    for k, v in enumerate(got):
        assert torch.equal(v, ref[k // 16][k % 16])


def test_jagged_values_into_one_destination_both_write_paths(client, fresh_rows, monkeypatch):
    """Values shorter than the destination's rows land at the start of each
    row; the rest of the row keeps what it held (row by row for few rows, one
    masked write in place for many)."""
    rows = list(fresh_rows(100))
    vals = [torch.arange(i % 13, dtype=torch.float64) * (i + 1) for i in range(100)]
    client.put(rows, {"j": vals})
    for per_row in (0, 1000):
        monkeypatch.setattr(_device, "PER_ROW_MAX", per_row)
        out = torch.full((100, 16), -1.0, dtype=torch.float64, device=DEV)
        res = client.get(rows, ["j"], out={"j": out})["j"]
        for i, v in enumerate(res):
            assert v.device == out.device and v.shape == (i % 13,) and torch.equal(v.cpu(), vals[i])
        host = out.cpu()
        assert all((host[i, i % 13:] == -1).all() for i in range(100))


def test_per_row_cuda_values_and_destinations(client, fresh_rows):
    """A list of CUDA tensors, one per row, is copied to host memory once; a
    list of CUDA destinations is refused with what to pass instead."""
    rows = list(fresh_rows(8))
    vals = [torch.full((i + 1,), float(i), device=DEV) for i in range(8)]
    client.put(rows, {"v": vals})
    got = client.get(rows, ["v"])["v"]
    assert all(torch.equal(g, v.cpu()) for g, v in zip(got, vals))
    with pytest.raises(ValueError, match="one tensor of the field's rows"):
        client.get(rows, ["v"], out={"v": [torch.empty(8, device=DEV) for _ in rows]})


def test_put_waits_for_the_callers_stream(client, fresh_rows):
    """A tensor still being written on the caller's current stream when put
    is called: the staged copies wait for that stream, so the new values land."""
    rows = list(fresh_rows(64))
    x = torch.zeros(64, 1 << 18, device=DEV)  # 64 MiB: 2 chunks
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    _slow_fill(x, 7.0, s)
    with torch.cuda.stream(s):
        client.put(rows, {"x": x})
    out = torch.empty_like(x)
    client.get(rows, ["x"], out={"x": out})
    assert bool((out == 7.0).all())


def test_get_out_is_complete_when_get_returns(client, fresh_rows):
    """After get(out=) returns, every device copy has landed: another stream
    reads the destination with no synchronisation of its own."""
    rows = list(fresh_rows(64))
    x = torch.randn(64, 1 << 18, device=DEV)
    client.put(rows, {"x": x})
    out = torch.zeros_like(x)
    client.get(rows, ["x"], out={"x": out})
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        same = torch.equal(out, x)
    assert same


def test_async_client_waits_for_the_awaiting_threads_stream(cluster, fresh_rows):
    rows = list(fresh_rows(32))

    async def main():
        async with dataplane.AsyncClient(cluster, timeout_s=20) as ac:
            x = torch.zeros(32, 1 << 18, device=DEV)
            torch.cuda.synchronize()
            s = torch.cuda.Stream()
            _slow_fill(x, 3.0, s)
            with torch.cuda.stream(s):
                await ac.put(rows, {"x": x})  # runs on a worker thread
                out = torch.empty_like(x)
                await ac.get(rows, ["x"], out={"x": out})
            return out

    out = asyncio.run(main())
    assert bool((out == 3.0).all())


def test_cuda_lazy_zeros_and_refusals(client, fresh_rows):
    rows = list(fresh_rows(20))
    z = torch._efficientzerotensor(21, 8, device=DEV)
    client.put(rows, {"z": z[1:]})
    assert all(torch.equal(v, torch.zeros(8)) for v in client.get(rows, ["z"])["z"])
    with pytest.raises(ValueError, match="no memory to write"):
        client.get(rows, ["z"], out={"z": torch._efficientzerotensor(20, 8, device=DEV)})
    with pytest.raises(ValueError, match="contiguous"):
        client.get(rows, ["z"], out={"z": torch.zeros(8, 20, device=DEV).t()})
    with pytest.raises(ValueError, match="register: a contiguous CPU tensor"):
        client.register(torch.zeros(8, device=DEV))


def test_staged_put_failing_part_way_names_the_rows_that_landed(client, fresh_rows):
    rows = list(fresh_rows(40))
    a = torch.randn(40, 1 << 19, device=DEV)  # 80 MiB: 2 chunks
    bad = [b"x"] * 40
    bad[39] = object()  # found only when the last chunk is put
    with pytest.raises(dataplane.InvalidArgument) as e:
        client.put(rows, {"a": a, "bad": bad})
    landed = e.value.landed
    assert landed and landed == rows[:len(landed)]
    got = client.get(landed, ["a"], out={"a": torch.empty(len(landed), 1 << 19, device=DEV)})
    assert all(torch.equal(v, a[i]) for i, v in enumerate(got["a"]))


def test_tq_adapter_with_cuda_values(cluster_dir, fresh_rows):
    from dataplane.tq import DataplaneKVClient

    rows = list(fresh_rows(6))
    kv = DataplaneKVClient({"cluster": cluster_dir})
    try:
        vals = [torch.randn(3, 4, device=DEV) for _ in rows] + [np.arange(i) for i in range(6)]
        keys = [f"{r}@t" for r in rows] + [f"{r}@n" for r in rows]
        meta = kv.put(keys, vals)
        got = kv.get(keys, custom_backend_meta=meta)
        for g, v in zip(got, vals):
            if isinstance(v, np.ndarray):
                assert np.array_equal(g, v)
            else:
                assert torch.equal(g, v.cpu())
    finally:
        kv.close()


def test_direct_transport_refuses_cuda_tensors(cluster):
    t = dataplane.Transport()
    try:
        with pytest.raises(dataplane.Error, match="publish a CPU copy"):
            t.publish("obj", [torch.zeros(4, device=DEV)])
    finally:
        t.close()
