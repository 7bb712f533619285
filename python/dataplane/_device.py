"""Device tensors (CUDA) in put and get(out=): staged through host memory
that is pinned (so the device copies run asynchronously) and registered with
the client (so the transfers need no further copy), chunk by chunk, so that
the device copy of one chunk runs while another chunk's transfer does
(docs/design.md, "Python package").

put: every chunk's device-to-host copy is queued at once on a side stream;
each chunk is put as soon as its copy is done, while the next ones copy.
get(out=): each chunk is got into host memory and its host-to-device copy
queued at once, while the next chunk's get runs; the call returns when every
copy is done. Rows land per chunk: a put that fails part way raises an error
whose .landed names every row that landed, earlier chunks' included.

The host memory is as big as the call's device tensors (kept for the next
call, grown when one needs more). STAGED names the device types staged this
way: "cuda" in use; the tests add "cpu" to drive the same pipeline (with
copies that are synchronous) on machines without a GPU.
"""

import threading

from . import _dtypes as dt

STAGED = ["cuda"]
CHUNK_MIN = 4 << 20  # bytes a chunk moves at least
CHUNKS_MAX = 8
_ALIGN = 64


def staged(v):
    """True if v is a tensor on a device this module stages."""
    return dt.is_tensor(v) and v.device.type in STAGED


def chunks(n, nbytes):
    """Row ranges [a, b) of n rows of nbytes in all: at most CHUNKS_MAX, each
    of CHUNK_MIN bytes or more (one when the batch is smaller)."""
    k = max(1, min(CHUNKS_MAX, n, nbytes // CHUNK_MIN))
    step = -(-n // k) if n else 1
    return [(a, min(n, a + step)) for a in range(0, n, step)] or [(0, 0)]


class _Copier:
    """Copies between devices and host memory: on a CUDA side stream of each
    device, asynchronous, with an event a chunk waits on; elsewhere
    synchronous."""

    def __init__(self):
        self.streams = {}

    def copy(self, dst, src, device):
        """Queue dst.copy_(src) (one of them on device); returns what to wait
        on (or None)."""
        if device.type != "cuda":
            with dt.torch.no_grad():
                dst.copy_(src)
            return None
        s = self.streams.get(device)
        if s is None:
            s = self.streams[device] = dt.torch.cuda.Stream(device)
            # the side stream starts after what the caller queued on its own
            s.wait_stream(dt.torch.cuda.current_stream(device))
        with dt.torch.cuda.stream(s), dt.torch.no_grad():
            if src.is_cuda:
                # copy_ to host would apply a lazy conjugation or negation to
                # the host bytes before the asynchronous copy lands (torch
                # issue 146286): resolve them on the device first
                src = src.resolve_conj().resolve_neg()
            dst.copy_(src, non_blocking=True)
            ev = dt.torch.cuda.Event()
            ev.record(s)
        return ev

    def drain(self):
        """Wait for every copy queued (also after an error: host memory a copy
        still writes or reads must not be reused before)."""
        for s in self.streams.values():
            s.synchronize()


class Stage:
    """A client's host staging memory for device tensors: one buffer, pinned
    when CUDA is there, registered with the client, grown when a call needs
    more. Calls that use it take turns (lock)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.buf = None

    def drop(self, client):
        """Let the buffer go (the library keeps it for good if a transfer may
        still touch it); the next call makes a new one."""
        old, self.buf = self.buf, None
        if old is not None:
            try:
                client.deregister(old)
            except Exception:
                pass

    def after_error(self, client):
        """After a failed call: a transfer that failed may still write the
        buffer (a late READ), so it must never be used again."""
        try:
            touched = self.buf is not None and client.touches_unfinished(self.buf)
        except Exception:  # the client closed meanwhile: never reuse it either
            touched = True
        if touched:
            self.drop(client)

    def host(self, client, nbytes):
        """A uint8 tensor of at least nbytes in the buffer (call with lock held)."""
        if self.buf is None or self.buf.numel() < nbytes:
            self.drop(client)
            pin = dt.torch.cuda.is_available()
            buf = dt.torch.empty(max(nbytes, 1 << 20), dtype=dt.torch.uint8, pin_memory=pin)
            client.register(buf)
            self.buf = buf
        return self.buf

    def views(self, client, like):
        """Host tensors shaped and typed as each tensor of like (a list), laid
        out one after another in the buffer (call with lock held)."""
        offs, total = [], 0
        for t in like:
            offs.append(total)
            total += (t.numel() * t.element_size() + _ALIGN - 1) // _ALIGN * _ALIGN
        host = self.host(client, total)
        out = []
        for t, off in zip(like, offs):
            nb = t.numel() * t.element_size()
            out.append(host[off:off + nb].view(t.dtype).view(t.shape))
        return out


def put(client, r, data, want_locs):
    """Client._put of rows r (a sequence) with device batch tensors among
    data's values, chunk by chunk; returns (r, fields, locs) as _put does."""
    from . import _core
    from .client import _dense, make_error

    fields = list(data)
    dev = [f for f in fields if staged(data[f])]
    n = len(r)
    if len(set(r)) != n:  # each chunk's put checks its own rows only
        twice = next(g for i, g in enumerate(r) if g in r[:i])
        raise make_error(_core.DP_EINVAL, f"put: row {twice} appears twice")
    for f in dev:
        _dense(data[f], f"field '{f}'")
    _check_rows(data, fields, n, "field '{}'")
    st = client._device_stage()
    with st.lock, _Guard(st, client):
        hosts = dict(zip(dev, st.views(client, [data[f] for f in dev])))
        nbytes = sum(h.numel() * h.element_size() for h in hosts.values())
        parts = chunks(n, nbytes)
        cp = _Copier()
        try:
            waits = []
            for a, b in parts:  # every device copy queued up front
                waits.append([cp.copy(hosts[f][a:b], data[f][a:b], data[f].device)
                              for f in dev])
            client._c._count_copy(nbytes)
            locs, landed = [], []
            for (a, b), evs in zip(parts, waits):
                for ev in evs:
                    if ev is not None:
                        ev.synchronize()
                part = {f: hosts[f][a:b] if f in hosts else data[f][a:b]
                        for f in fields}
                try:
                    locs.append(client._put(r[a:b], part, want_locs, False)[2])
                except Exception as e:
                    if not landed and (b == n or not hasattr(e, "landed")):
                        raise  # the only chunk, or a bad value found before any landed
                    raise _partly(e, r[a:], landed, n) from e
                landed.extend(r[a:b])
        finally:
            cp.drain()
    return r, fields, (b"".join(locs) if want_locs else None)


def _check_rows(data, fields, n, what):
    """ValueError unless each field's tensor, array or list has n rows (the
    chunks slice them: a longer one would lose rows, a shorter one fail part
    way)."""
    for f in fields:
        v = data[f]
        if dt.is_tensor(v) or dt.is_array(v):
            k = v.shape[0] if len(v.shape) else None
        elif isinstance(v, (list, tuple)):
            k = len(v)
        else:
            continue  # the chunk's own checks name what it is
        if k != n:
            raise ValueError(f"{what.format(f)}: {n} rows are needed (the first dimension "
                             f"or the list's length), got {k if k is not None else 'a 0-d value'}")


class _Guard:
    """On an error inside a staged call: the staging buffer is dropped when a
    failed transfer may still touch it."""

    def __init__(self, st, client):
        self.st, self.client = st, client

    def __enter__(self):
        return self

    def __exit__(self, typ, *rest):
        if typ is not None:
            self.st.after_error(self.client)
        return False


def _partly(e, rest, landed, n):
    """The error of a chunk's put after earlier chunks landed: its class (a
    dataplane.Error; InvalidArgument for a bad value found there), with
    .landed every row that landed and .rows the others."""
    from . import _core
    from .client import make_error

    got = list(getattr(e, "landed", None) or [])
    seen = set(got)
    code = getattr(e, "code", _core.DP_EINVAL)
    detail = getattr(e, "detail", None) or str(e)
    return make_error(code, f"{detail} (in the chunk from row {rest[0]}; "
                            f"{len(landed) + len(got)} of {n} rows landed: the staged put "
                            f"goes in chunks, later ones were not sent)",
                      rows=[g for g in rest if g not in seen], landed=landed + got)


def get_out(client, r, fields, out, stack):
    """Client._get_out with device batch tensors among out's values, chunk by
    chunk; the values returned are views of out's tensors."""
    n = len(r)
    dev = [f for f in fields if f in out and staged(out[f])]
    _check_rows(out, [f for f in fields if f in out], n, "out['{}']")
    for f in dev:
        o = out[f]
        if not o.is_contiguous() or o.is_conj() or o.is_neg():
            raise ValueError(f"out['{f}']: a contiguous tensor (not a lazily conjugated or "
                             f"negated view) is needed on {o.device}")
    st = client._device_stage()
    res = {f: [] for f in fields}
    with st.lock, _Guard(st, client):
        hosts = dict(zip(dev, st.views(client, [out[f] for f in dev])))
        nbytes = sum(h.numel() * h.element_size() for h in hosts.values())
        cp = _Copier()
        try:
            for a, b in chunks(n, nbytes):
                part = {f: hosts[f][a:b] if f in hosts else out[f][a:b]
                        for f in fields if f in out}
                got = client._get_out(r[a:b], fields, part, stack, False)
                for f in dev:
                    cp.copy(out[f][a:b], hosts[f][a:b], out[f].device)
                for f in fields:
                    res[f].append(got[f])
            client._c._count_copy(nbytes)
        finally:
            cp.drain()
    for f in fields:
        if stack:
            res[f] = out[f]
        elif f in hosts:
            res[f] = [_on_device(v, hosts[f], out[f]) for part in res[f] for v in part]
        else:
            res[f] = [v for part in res[f] for v in part]
    return res


def _on_device(v, host, o):
    """The view of device tensor o that v (a view of host, o's staging copy)
    is of host: same byte offset, dtype and shape."""
    off = v.data_ptr() - host.data_ptr()
    nb = v.numel() * v.element_size()
    flat = o.view(-1).view(dt.torch.uint8)
    return flat[off:off + nb].view(v.dtype).view(v.shape)
