"""dataplane.AsyncClient: awaited operations that never block the loop."""

import asyncio
import concurrent.futures

import numpy as np
import pytest
import torch

import dataplane


def test_async_round_trip(cluster, fresh_rows):
    rows = fresh_rows(4)
    t = torch.randn(4, 33)
    a = np.arange(8, dtype=np.uint16).reshape(4, 2)

    async def main():
        async with dataplane.AsyncClient(cluster, timeout_s=20) as c:
            assert isinstance(c.client, dataplane.Client)
            await c.put(rows, {"t": t, "a": a, "b": [b"0", b"1", b"2", b"3"]})
            got = await c.get(rows, ["t", "a", "b"])
            keyed = await c.get_keys([f"{rows[3]}@t", f"{rows[0]}@b"])
            out = torch.zeros(4, 33)
            into = await c.get(rows, ["t"], out={"t": out})
            stats = await c.stats()
            dropped = await c.clear(rows[:2])
            with pytest.raises(dataplane.NotFound):
                await c.get(rows[:2], ["t"])
            return got, keyed, out, into, stats, dropped, c

    got, keyed, out, into, stats, dropped, c = asyncio.run(main())
    for i in range(4):
        assert torch.equal(got["t"][i], t[i])
        assert got["a"][i].dtype == np.uint16 and np.array_equal(got["a"][i], a[i])
        assert torch.equal(into["t"][i], t[i])
    assert got["b"] == [b"0", b"1", b"2", b"3"]
    assert torch.equal(keyed[0], t[3]) and keyed[1] == b"0"
    assert torch.equal(out, t)
    assert len(stats) == 2
    assert dropped == 6
    assert c.client.closed


def test_async_opens_on_first_use(cluster, fresh_rows):
    rows = fresh_rows(1)

    async def main():
        c = dataplane.AsyncClient(cluster, timeout_s=20)
        assert c.client is None
        # two calls racing to open share one Client
        await asyncio.gather(c.put(rows, {"x": [b"a"]}), c.stats())
        first = c.client
        assert (await c.get(rows, ["x"]))["x"] == [b"a"]
        assert c.client is first
        await c.close()
        return first

    first = asyncio.run(main())
    assert first.closed


def test_async_shared_executor(cluster, fresh_rows):
    rows = fresh_rows(2)
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        async def main():
            async with dataplane.AsyncClient(cluster, executor=ex, timeout_s=20) as c1, \
                    dataplane.AsyncClient(cluster, executor=ex, timeout_s=20) as c2:
                await asyncio.gather(c1.put(rows[:1], {"s": [b"one"]}),
                                     c2.put(rows[1:], {"s": [b"two"]}))
                return await c2.get(rows, ["s"])

        assert asyncio.run(main())["s"] == [b"one", b"two"]
        assert ex.submit(lambda: 5).result() == 5  # the caller's executor stays up


def test_async_errors_propagate(cluster):
    async def main():
        async with dataplane.AsyncClient(cluster, timeout_s=20) as c:
            with pytest.raises(dataplane.InvalidArgument):
                await c.get_keys(["bad key"])
            with pytest.raises(TypeError):
                await c.put([1], {"x": [object()]})

    asyncio.run(main())


def test_async_open_failure(tmp_path):
    async def main():
        with pytest.raises(dataplane.NotFound):
            async with dataplane.AsyncClient(tmp_path, timeout_s=5):
                pass

    asyncio.run(main())


def test_loop_keeps_ticking_during_large_get(cluster, fresh_rows):
    rows = fresh_rows(64)
    data = torch.randn(64, 256 * 1024)  # 64 x 1 MiB

    async def main():
        async with dataplane.AsyncClient(cluster, timeout_s=20) as c:
            await c.put(rows, {"big": data})
            ticks = [0]
            stop = asyncio.Event()

            async def ticker():
                while not stop.is_set():
                    ticks[0] += 1
                    await asyncio.sleep(0)

            tt = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            during = []
            for _ in range(3):
                before = ticks[0]
                got = await c.get(rows, ["big"])
                during.append(ticks[0] - before)
            stop.set()
            await tt
            return got, during

    got, during = asyncio.run(main())
    for i in (0, 17, 63):
        assert torch.equal(got["big"][i], data[i])
    # the loop ran the ticker while every get was in flight
    assert all(d >= 10 for d in during), during


def test_async_calls_after_close_raise_closed(cluster):
    """After close (or leaving `async with`) a call raises dataplane.Closed,
    as Client's do, not the executor's RuntimeError."""
    async def main():
        async with dataplane.AsyncClient(cluster, timeout_s=20) as c:
            await c.stats()
        with pytest.raises(dataplane.Closed):
            await c.get([1], ["x"])

    asyncio.run(main())
