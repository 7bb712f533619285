"""dataplane.AsyncClient: the Client's operations as coroutines.

Each operation runs on a worker thread (the extension releases the GIL while
it waits on the network), so awaiting it never blocks the event loop.

    async with dataplane.AsyncClient(cluster) as c:
        await c.put(rows, {"obs": obs})
        got = await c.get(rows, ["obs"])
"""

import asyncio
import concurrent.futures
import functools

from . import _core, _device
from .client import Client, make_error


class AsyncClient:
    """A Client whose operations are awaited. Opening connects on a worker
    thread too (on first use, or in `async with`). executor: where the calls
    run (default: a pool of `workers` threads of its own; calls on one client
    take turns in the library anyway, so more workers only help with several
    AsyncClients sharing an executor)."""

    def __init__(self, cluster=None, *, executor=None, workers=2, **opts):
        self._args = (cluster, opts)
        self._client = None
        self._own = executor is None
        self._ex = executor or concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="dataplane")
        self._opening = None
        self._closed = False

    async def _run(self, fn, *args, **kw):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._ex, functools.partial(fn, *args, **kw))

    async def open(self):
        if self._closed:
            raise make_error(_core.DP_ECLOSED, "this AsyncClient is closed")
        if self._client is None:
            if self._opening is None:
                cluster, opts = self._args
                self._opening = asyncio.ensure_future(
                    self._run(lambda: Client(cluster, **opts)))
            self._client = await self._opening
        return self

    async def _call(self, name, *args, **kw):
        if self._closed:
            raise make_error(_core.DP_ECLOSED, "this AsyncClient is closed")
        await self.open()
        return await self._run(getattr(self._client, name), *args, **kw)

    async def _call_after(self, values, name, *args, **kw):
        """_call for an operation on values that may be CUDA tensors: its
        copies wait for what this thread queued on its current streams (the
        worker thread's current stream is another)."""
        if self._closed:
            raise make_error(_core.DP_ECLOSED, "this AsyncClient is closed")
        await self.open()
        marks = _device.caller_marks(values)
        if not marks:
            return await self._run(getattr(self._client, name), *args, **kw)
        return await self._run(_device.after_marks, marks, getattr(self._client, name),
                               *args, **kw)

    async def put(self, rows, data):
        vals = data.values() if hasattr(data, "values") else ()
        return await self._call_after(vals, "put", rows, data)

    async def get(self, rows, fields, *, out=None, stack=False):
        vals = out.values() if hasattr(out, "values") else ()
        return await self._call_after(vals, "get", rows, fields, out=out, stack=stack)

    async def get_keys(self, keys):
        return await self._call("get_keys", keys)

    async def clear(self, rows):
        return await self._call("clear", rows)

    async def stats(self):
        return await self._call("stats")

    @property
    def client(self):
        """The underlying Client (None until opened)."""
        return self._client

    async def close(self):
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            await self._run(self._client.close)
        if self._own:
            self._ex.shutdown(wait=False)

    async def __aenter__(self):
        return await self.open()

    async def __aexit__(self, *exc):
        await self.close()
