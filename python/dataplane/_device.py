"""Device tensors (CUDA) in put and get(out=): staged through host memory
that is pinned (so the device copies run asynchronously) and registered with
the client (so the transfers need no further copy), chunk by chunk, so that
the device copy of one chunk runs while another chunk's transfer does
(docs/design.md, "Python package").

The host memory is a ring of SLOTS chunks (kept for the next call, grown
when one needs more), whatever the batch's size. put: the first SLOTS
chunks' device-to-host copies are queued at once on a side stream; each
chunk is put as soon as its copy is done, and the copy of the chunk SLOTS
later is queued into the slot it freed. get(out=): each chunk is got into
its slot (once the device copy reading it before is done) and its
host-to-device copy queued, while the next chunk's get runs; values shorter
than their rows are written without the rest of the row. The call returns
when every copy is done. Rows land per chunk: a put that fails part way
raises an error whose .landed names every row that landed, earlier chunks'
included.

STAGED names the device types staged this
way: "cuda" in use; the tests add "cpu" to drive the same pipeline (with
copies that are synchronous) on machines without a GPU.
"""

import threading

from . import _core
from . import _dtypes as dt

STAGED = ["cuda"]
# Measured on an H200 (docs/design.md, "Device tensors"): a chunk costs its
# put's fixed work (about 0.3-0.4 ms), so chunks under 16 MiB lost more than
# the overlap won; a batch under 2 x CHUNK_MIN goes in one, unpipelined.
CHUNK_MIN = 32 << 20  # bytes a chunk moves at least (unless the batch is smaller)
CHUNK_MAX = 128 << 20  # and at most, when its rows are not bigger
CHUNKS = 8  # chunks of a batch between CHUNKS x CHUNK_MIN and CHUNKS x CHUNK_MAX
SLOTS = 2  # chunks in host memory at once: one copied while one moves
_ALIGN = 64


def staged(v):
    """True if v is a tensor on a device this module stages."""
    return dt.is_tensor(v) and v.device.type in STAGED


def chunks(n, nbytes):
    """Row ranges [a, b) of n rows of nbytes in all, of equal row counts: up
    to CHUNKS of CHUNK_MIN bytes or more (one when the batch is smaller),
    more when that many would exceed CHUNK_MAX bytes each (one row a chunk at
    most)."""
    k = max(1, min(n, max(min(CHUNKS, nbytes // CHUNK_MIN), -(-nbytes // CHUNK_MAX))))
    step = -(-n // k) if n else 1
    if step > 1 and step * nbytes > CHUNK_MAX * n:  # the rounding up made them bigger
        step = max(1, CHUNK_MAX * n // nbytes)
    return [(a, min(n, a + step)) for a in range(0, n, step)] or [(0, 0)]


NO_MEMORY = 1 << 16  # a data pointer below: no memory (torch's lazy zeros, their slices)
PER_ROW_MAX = 16  # chunks of up to this many rows write short values row by row


class _Copier:
    """Copies of one call between devices and host memory: on the CUDA side
    stream of each device (the client's, kept in its Stage, so that the
    caching allocator's blocks stay on one stream), asynchronous, with an
    event a chunk waits on; elsewhere synchronous."""

    def __init__(self, streams):
        self.streams = streams  # device: side stream (the Stage's)
        self.used = set()  # devices this call has queued on

    def _stream(self, device):
        """device's side stream, made to wait, on this call's first use, for
        what the calling thread queued on its current stream (and, for a
        call run on behalf of another thread, what that one had: marks)."""
        s = self.streams.get(device)
        if s is None:
            s = self.streams[device] = dt.torch.cuda.Stream(device)
        if device not in self.used:
            self.used.add(device)
            s.wait_stream(dt.torch.cuda.current_stream(device))
        return s

    def copy(self, dst, src, device):
        """Queue dst.copy_(src) (one of them on device); returns what to wait
        on (or None)."""
        if device.type != "cuda":
            with dt.torch.no_grad():
                dst.copy_(src)
            return None
        s = self._stream(device)
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

    def copy_prefixes(self, dst, src, lens, device):
        """Queue, for every row i of dst (on device) and src (host, alike):
        its first lens[i] bytes copied, the rest of dst's row left as it is
        (values shorter than the destination's rows: the unstaged get leaves
        the rest of each row alone too). A chunk of few rows (its rows may be
        huge) is copied row by row from the host memory, with no device
        memory used; more rows (each then under CHUNK_MAX / PER_ROW_MAX) go
        in one copy and one masked write in place, instead of a copy per row.
        Returns what to wait on."""
        rows = dst.shape[0]
        db = dst.view(-1).view(dt.torch.uint8).view(rows, -1)
        sb = src.view(-1).view(dt.torch.uint8).view(rows, -1)
        if device.type != "cuda":
            self._prefixes(db, sb, lens, device, False)
            return None
        s = self._stream(device)
        with dt.torch.cuda.stream(s):
            self._prefixes(db, sb, lens, device, True)
            ev = dt.torch.cuda.Event()
            ev.record(s)
        return ev

    @staticmethod
    def _prefixes(db, sb, lens, device, nb):
        torch = dt.torch
        with torch.no_grad():
            if db.shape[0] <= PER_ROW_MAX:
                for i, k in enumerate(lens):
                    if k:
                        db[i, :k].copy_(sb[i, :k], non_blocking=nb)
                return
            n = torch.tensor(lens, dtype=torch.int32)
            if nb:  # from pinned memory: no wait for the stream's earlier copies
                n = n.pin_memory()
            n = n.to(device, non_blocking=nb)
            d = sb.to(device, non_blocking=nb) if nb else sb
            mask = torch.arange(db.shape[1], dtype=torch.int32, device=device)[None, :]
            torch.where(mask < n[:, None], d, db, out=db)

    def drain(self):
        """Wait for every copy this call queued (also after an error: host
        memory a copy still writes or reads must not be reused before)."""
        for dev in self.used:
            self.streams[dev].synchronize()


def caller_marks(values):
    """For a call another thread runs on this one's behalf (AsyncClient): an
    event on this thread's current stream of each CUDA device among values
    (tensors, or lists of them), so the copies wait for what this thread
    queued (the other thread's current stream is another). None without
    CUDA."""
    torch = dt.torch
    if torch is None or not torch.cuda.is_available():
        return None
    devs = set()
    for v in values:
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            if dt.is_tensor(x) and x.is_cuda:
                devs.add(x.device)
    marks = {}
    for d in devs:
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(d))
        marks[d] = ev
    return marks


def after_marks(marks, fn, *args, **kw):
    """fn(*args, **kw) on this thread once its current streams wait for marks
    (caller_marks of the thread the call is for)."""
    for d, ev in (marks or {}).items():
        dt.torch.cuda.current_stream(d).wait_event(ev)
    return fn(*args, **kw)


class Stage:
    """A client's host staging memory for device tensors: one buffer, pinned
    when CUDA is there, registered with the client, grown when a call needs
    more. Calls that use it take turns (lock)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.buf = None
        self.streams = {}  # device: the side stream of this client's copies

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

    def ring(self, client, like, rows, slots):
        """slots lists of host tensors, one per tensor of like (a list), each
        shaped and typed as `rows` rows of it, laid out one after another in
        the buffer (call with lock held)."""
        offs, total = [], 0
        for _ in range(slots):
            for t in like:
                offs.append(total)
                nb = rows * (t[0].numel() if len(t) else 0) * t.element_size()
                total += (nb + _ALIGN - 1) // _ALIGN * _ALIGN
        host = self.host(client, total)
        out, i = [], 0
        for _ in range(slots):
            slot = []
            for t in like:
                nb = rows * (t[0].numel() if len(t) else 0) * t.element_size()
                slot.append(host[offs[i]:offs[i] + nb].view(t.dtype)
                            .view((rows,) + tuple(t.shape[1:])))
                i += 1
            out.append(slot)
        return out


def _row_bytes(ts):
    """Bytes of one row of every tensor of ts."""
    return sum((t[0].numel() if len(t) else 0) * t.element_size() for t in ts)


def put(client, r, data, want_locs):
    """Client._put of rows r (a sequence) with device batch tensors among
    data's values, chunk by chunk; returns (r, fields, locs) as _put does."""
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
        src = [data[f] for f in dev]
        row_bytes = _row_bytes(src)
        parts = chunks(n, n * row_bytes)
        step, ns = parts[0][1] - parts[0][0], min(SLOTS, len(parts))
        ring = st.ring(client, src, step, ns)
        cp = _Copier(st.streams)

        def queue(k):  # chunk k's device copies into its slot
            a, b = parts[k]
            evs = [cp.copy(h[:b - a], t[a:b], t.device) for h, t in zip(ring[k % ns], src)]
            client._c._count_copy((b - a) * row_bytes)
            return evs

        try:
            waits = {k: queue(k) for k in range(ns)}  # the first slots' copies at once
            locs, landed = [], []
            for k, (a, b) in enumerate(parts):
                for ev in waits.pop(k):
                    if ev is not None:
                        ev.synchronize()
                hosts = dict(zip(dev, ring[k % ns]))
                part = {f: hosts[f][:b - a] if f in hosts else data[f][a:b]
                        for f in fields}
                try:
                    locs.append(client._put(r[a:b], part, want_locs, False)[2])
                except Exception as e:
                    if not landed and (b == n or not hasattr(e, "landed")):
                        raise  # the only chunk, or a bad value found before any landed
                    raise _partly(e, r[a:], landed, n) from e
                landed.extend(r[a:b])
                if k + ns < len(parts):  # its slot is free: the put has read it
                    waits[k + ns] = queue(k + ns)
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
        if o.numel() and o.data_ptr() < NO_MEMORY:
            raise ValueError(f"out['{f}']: the tensor has no memory to write (torch's lazy "
                             f"zeros, e.g. torch._efficientzerotensor); pass one made with "
                             f"torch.empty")
    st = client._device_stage()
    res = {f: [] for f in fields}
    with st.lock, _Guard(st, client):
        dst = [out[f] for f in dev]
        row_bytes = _row_bytes(dst)
        parts = chunks(n, n * row_bytes)
        step, ns = parts[0][1] - parts[0][0], min(SLOTS, len(parts))
        ring = st.ring(client, dst, step, ns)
        cp = _Copier(st.streams)
        reading = {}  # slot: the events of the device copies still reading it
        missing = []  # keys not found, of every chunk
        try:
            for k, (a, b) in enumerate(parts):
                for ev in reading.pop(k % ns, ()):
                    if ev is not None:
                        ev.synchronize()
                hosts = dict(zip(dev, ring[k % ns]))
                part = {f: hosts[f][:b - a] if f in hosts else out[f][a:b]
                        for f in fields if f in out}
                try:
                    got = client._get_out(r[a:b], fields, part, stack, False)
                except _core.NotFound as e:  # the other chunks still say what they miss
                    missing += list(e.keys or [])
                    continue
                evs = reading[k % ns] = []
                for f in dev:
                    o, h = out[f][a:b], hosts[f][:b - a]
                    whole = (o.numel() // max(1, b - a)) * o.element_size()
                    lens = None if stack else [v.numel() * v.element_size() for v in got[f]]
                    if lens is None or all(x == whole for x in lens):
                        evs.append(cp.copy(o, h, o.device))
                    else:  # shorter values: the rest of their rows stays as it was
                        evs.append(cp.copy_prefixes(o, h, lens, o.device))
                client._c._count_copy((b - a) * row_bytes)
                for f in fields:
                    if stack:
                        continue
                    if f in hosts:  # views of out's rows, not of the slot
                        res[f] += [_on_device(v, hosts[f], out[f][a:b]) for v in got[f]]
                    else:
                        res[f] += got[f]
        finally:
            cp.drain()
    if missing:
        from .client import make_error
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more"
                                          if len(missing) > 8 else "")
        raise make_error(_core.DP_ENOTFOUND, f"{len(missing)} key(s) not found: {shown} "
                         f"(rows of chunks without a missing key were written to out)",
                         keys=missing)
    return {f: out[f] for f in fields} if stack else res


def _on_device(v, host, o):
    """The view of device tensor o that v (a view of host, o's staging copy)
    is of host: same byte offset, dtype and shape."""
    nb = v.numel() * v.element_size()
    off = v.data_ptr() - host.data_ptr() if nb else 0  # an empty view's pointer may be 0
    flat = o.view(-1).view(dt.torch.uint8)
    return flat[off:off + nb].view(v.dtype).view(v.shape)
