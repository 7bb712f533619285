"""dataplane.Transport: hand tensors from one process to another, one-sided.

The publisher keeps its tensors and hands out metadata (bytes, by any means:
a queue, a Ray object, a file); the fetcher READs the tensors straight out of
the publisher's memory, with no server in between.

    # publisher                               # fetcher
    t = dataplane.Transport()                 t = dataplane.Transport()
    md = t.publish("w1", [w, b])              req = t.fetch("w1", md)
    ...                                       w, b = req.wait(timeout=30)
    t.free("w1")   # after the fetch

Metadata: b"DPPYMD01", a 4-byte little-endian length, a JSON list of
[origin, dtype, shape] per tensor ("torch" or "numpy"), then the library's
own transport metadata (docs/design.md, "Python package").
"""

import json
import struct

from . import _core, _device
from . import _dtypes as dt
from ._dtypes import np, torch
from .client import _dense, make_error

_MAGIC = b"DPPYMD01"


def _native(x):
    """x with its values in its memory as stored: lazy conjugate and negative
    torch views resolved, numpy arrays in native byte order (a copy when
    needed; the caller keeps it alive)."""
    if dt.is_tensor(x):
        return x.resolve_conj().resolve_neg()
    if dt.is_array(x) and not dt.native_order(x):
        return x.astype(x.dtype.newbyteorder("="))
    return x


def _describe(x, i):
    if dt.is_tensor(x):
        _dense(x, f"tensor {i}")
        if x.device.type != "cpu":
            raise make_error(_core.DP_EUNSUPPORTED,
                             f"tensor {i} is on {x.device}: publish a CPU copy "
                             f"(GPU memory is not published by this build)")
        if not x.is_contiguous():
            raise ValueError(f"tensor {i}: a contiguous tensor is needed (the "
                             f"fetcher reads its memory as it is)")
        if x.numel() and x.data_ptr() < _device.NO_MEMORY:
            raise ValueError(f"tensor {i} has no memory (torch's lazy zeros, e.g. "
                             f"torch._efficientzerotensor); publish torch.zeros of it")
        return ["torch", dt.torch_name(x.dtype), list(x.shape)], (
            x.data_ptr(), x.numel() * x.element_size())
    if dt.is_array(x):
        if not x.flags.c_contiguous:
            raise ValueError(f"array {i}: a C-contiguous array is needed")
        return ["numpy", dt.numpy_name(x.dtype), list(x.shape)], (
            x.__array_interface__["data"][0], x.nbytes)
    raise TypeError(f"item {i}: a tensor or array is needed, got {type(x).__name__}")


def _parse(md):
    if not isinstance(md, (bytes, bytearray, memoryview)):
        raise TypeError("metadata: bytes from Transport.publish are needed")
    md = bytes(md)
    if len(md) < 12 or md[:8] != _MAGIC:
        raise make_error(_core.DP_EPROTO,
                         "metadata: not from dataplane.Transport.publish (bad magic)")
    (n,) = struct.unpack_from("<I", md, 8)
    if 12 + n > len(md):
        raise make_error(_core.DP_EPROTO, "metadata: truncated description")
    try:
        desc = json.loads(md[12:12 + n])
        ok = isinstance(desc, list) and all(
            isinstance(d, list) and len(d) == 3 and isinstance(d[1], str)
            and ((d[0] == "torch" and d[1] in dt.NAME_TO_TORCH)
                 or (d[0] == "numpy" and d[1] in dt.NAME_TO_NUMPY))
            and isinstance(d[2], list)
            and all(isinstance(s, int) and s >= 0 for s in d[2]) for d in desc)
    except ValueError:
        ok = False
    if not ok:
        raise make_error(_core.DP_EPROTO, "metadata: malformed tensor description")
    return desc, md[12 + n:]


def _nbytes(d):
    n = dt.itemsize(d[1])
    for s in d[2]:
        n *= s
    return n


def _make(d, buf):
    origin, name, shape = d
    if _nbytes(d) == 0:
        if origin == "torch":
            return torch.empty(shape, dtype=dt.NAME_TO_TORCH[name])
        return np.empty(shape, dtype=dt.NAME_TO_NUMPY[name])
    if origin == "torch":
        return torch.frombuffer(buf, dtype=dt.NAME_TO_TORCH[name]).view(shape)
    return np.frombuffer(buf, dtype=dt.NAME_TO_NUMPY[name]).reshape(shape)


class FetchRequest:
    """A fetch in flight: wait() gives the tensors once every byte arrived."""

    def __init__(self, fetch, desc, out):
        self._f, self._desc, self._out = fetch, desc, out

    def wait(self, timeout=None):
        """The tensors (the out= ones when given). timeout: seconds, None for
        ever. Raises Timeout if still running (wait again), else the fetch's
        error (Canceled after abort, TransferError if the publisher died)."""
        self._f.wait(-1.0 if timeout is None else float(timeout))
        if self._out is not None:
            return self._out
        bufs = self._f.buffers()
        sized = [d for d in self._desc if _nbytes(d)]
        if len(bufs) != len(sized) or any(len(b) != _nbytes(d) for b, d in zip(bufs, sized)):
            raise make_error(_core.DP_EPROTO,
                             "metadata: the tensor description does not match the "
                             "published buffers (count or sizes)")
        it = iter(bufs)
        return [_make(d, next(it) if _nbytes(d) else None) for d in self._desc]

    @property
    def done(self):
        return self._f.ended

    @property
    def progress(self):
        """(bytes done, bytes in all)."""
        return self._f.progress

    def close(self):
        """Stop the fetch if it runs and free it (tensors it returned stay valid)."""
        self._f.close()


class Transport:
    """The direct transport of this process (see the module's text).
    Options are the library's: name, pool_bytes, xfer_timeout_s, chunk_bytes,
    n_workers, remote_cache_size, fetch_cache_bytes (bytes of freed fetch
    buffers kept for reuse: 0 the default, 256 MiB or an eighth of the
    host's memory if less; -1 none)."""

    def __init__(self, *, name=None, pool_bytes=0, xfer_timeout_s=0.0, chunk_bytes=0,
                 n_workers=0, remote_cache_size=0, fetch_cache_bytes=0):
        self._t = _core.Transport(name, int(pool_bytes), float(xfer_timeout_s),
                                  int(chunk_bytes), int(n_workers),
                                  int(remote_cache_size), int(fetch_cache_bytes))
        self._pinned = {}  # address -> what register() keeps alive

    @property
    def name(self):
        return self._t.name

    def publish(self, obj_id, tensors):
        """Publish tensors (or arrays) under obj_id; returns the metadata to
        hand to fetchers. Keep the tensors unchanged until free(obj_id); the
        transport keeps them alive until then."""
        tensors = [_native(x) for x in tensors]
        descs, spans = [], []
        for i, x in enumerate(tensors):
            d, s = _describe(x, i)
            descs.append(d)
            if s[1] > 0:  # empty tensors travel in the description only
                spans.append(s)
        head = json.dumps(descs, separators=(",", ":")).encode()
        md = self._t.publish(obj_id, spans, tensors)
        return _MAGIC + struct.pack("<I", len(head)) + head + md

    def fetch(self, obj_id, metadata, out=None):
        """Start fetching obj_id; returns a FetchRequest. out: tensors or arrays
        of the published sizes to receive into (kept alive by the request)."""
        desc, md = _parse(metadata)
        targets = None
        if out is not None:
            out = list(out)
            if len(out) != len(desc):
                raise ValueError(f"out: {len(out)} tensors for {len(desc)} published")
            targets = []
            for i, (o, d) in enumerate(zip(out, desc)):
                if dt.is_array(o) and not o.flags.writeable:
                    raise ValueError(f"out[{i}]: a writable array is needed")
                _, (addr, n) = _describe(o, i)
                if n != _nbytes(d):
                    raise ValueError(f"out[{i}]: {n} bytes, the published tensor has "
                                     f"{_nbytes(d)}")
                if n > 0:
                    targets.append((addr, n))
        return FetchRequest(self._t.fetch(obj_id, md, targets, out), desc, out)

    def register(self, x):
        """Register x's memory (a CPU tensor or array) for good: objects
        published later with buffers inside it use this registration instead
        of registering (and deregistering) their own. x is kept alive until
        deregister(x)."""
        x = _native(x)
        _, (addr, n) = _describe(x, 0)
        if n == 0:
            raise ValueError("register: an empty tensor has no memory to register")
        self._t._register(addr, n, True)
        self._pinned[addr] = x

    def deregister(self, x):
        """Drop what register(x) kept: deregistered now if no published
        object holds the memory, else when the last one is freed. KeyError
        (dataplane.NotFound) if x's memory is not registered for good."""
        _, (addr, n) = _describe(_native(x), 0)
        self._t._register(addr, n, False)
        self._pinned.pop(addr, None)

    def abort(self, obj_id):
        """Make fetches of obj_id (running, or the next one) fail with Canceled."""
        self._t.abort(obj_id)

    def free(self, obj_id):
        """Let go of obj_id's tensors (fetches after this may read anything)."""
        self._t.free(obj_id)

    def stats(self):
        return self._t.stats()

    def close(self):
        """Refused (Busy) while fetch requests live: close them first."""
        self._t.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
