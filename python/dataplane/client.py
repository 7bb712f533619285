"""dataplane.Client: put, get and clear rows of named fields.

The C extension (dataplane._core) does the work with the GIL released; this
layer turns tensors, arrays and bytes into the forms it takes and the values
that come back into tensors and arrays again (docs/design.md, "Python
package").
"""

import os
import threading

from . import _core
from . import _device
from . import _dtypes as dt
from ._dtypes import np, torch

_ALIGN = 64
_STAGE_LOCK = threading.Lock()


def _ckpt_dir(directory):
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"a checkpoint directory (str or path) is needed, got "
                        f"{type(directory).__name__}")
    return os.path.abspath(os.fspath(directory))


def make_error(rc, msg, keys=None, rows=None, landed=None):
    """The exception for code rc (its class and attributes are the extension's)."""
    return _core.error(rc, msg, keys, rows, landed)


def _rows(rows):
    """Rows as the extension takes them: a list of ints or a 1-D int buffer."""
    if dt.is_tensor(rows):
        if (rows.dim() != 1 or rows.dtype.is_floating_point or rows.dtype.is_complex
                or rows.dtype == torch.bool):
            raise TypeError(f"rows: a 1-D integer tensor is needed, got {rows.dtype} "
                            f"of shape {tuple(rows.shape)}")
        return rows.detach().to("cpu", torch.int64).contiguous().numpy()
    if dt.is_array(rows):
        if rows.ndim != 1 or rows.dtype.kind not in "iu":
            raise TypeError(f"rows: a 1-D integer array is needed, got {rows.dtype} "
                            f"of shape {rows.shape}")
        return np.ascontiguousarray(rows, dtype=rows.dtype.newbyteorder("="))
    if isinstance(rows, (list, tuple, range)):
        return tuple(rows)  # a snapshot: the count stays what the columns were checked against
    raise TypeError(f"rows: a sequence of ints or a 1-D integer tensor/array is "
                    f"needed, got {type(rows).__name__}")


class _Copies:
    """Values that must be copied before a put (non-contiguous, on a GPU, or of
    another byte order): each is copied once, into registered memory of the
    client, so the put then moves it without a further staging copy."""

    def __init__(self, client):
        self.client = client
        self.jobs = []  # (src, nbytes, place): place(address) fills the cell
        self.total = 0
        self.buf = None
        self.views = []

    def add(self, src, nbytes, place):
        off = self.total
        self.total += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        self.jobs.append((src, nbytes, off, place))

    def run(self):
        if not self.jobs:
            return
        self.buf = self.client._c.alloc(max(self.total, 1))
        base = self.buf.address
        for src, nbytes, off, place in self.jobs:
            if nbytes:
                if dt.is_tensor(src):
                    dst = torch.frombuffer(self.buf, dtype=torch.uint8, count=nbytes,
                                           offset=off)
                    dst = dst.view(src.dtype).view(src.shape)
                    dst.copy_(src)
                else:
                    dst = np.frombuffer(self.buf, dtype=np.uint8, count=nbytes,
                                        offset=off)
                    dst = dst.view(src.dtype.newbyteorder("=")).reshape(src.shape)
                    dst[...] = src
                self.views.append(dst)
            place(base + off)
        self.client._c._count_copy(sum(j[1] for j in self.jobs))

    def close(self):
        self.views.clear()
        self.jobs.clear()
        self.buf = None  # freed; kept by the library if a failed WRITE touches it


def _dense(t, where):
    """TypeError unless t is a dense tensor with memory (not nested, sparse or
    on the meta device)."""
    if t.is_nested or t.layout != torch.strided or t.device.type == "meta":
        kind = ("nested tensor" if t.is_nested else f"{t.layout} tensor"
                if t.layout != torch.strided else "tensor on the meta device (no data)")
        raise TypeError(f"{where}: cannot store a {kind} (dense tensors only; "
                        f"unbind a nested one, .to_dense() a sparse one)")


def _tensor_ok(t):
    """True if t's memory holds its values as they are: a contiguous CPU
    tensor that is not a lazy conjugate or negative view."""
    return (t.device.type == "cpu" and t.is_contiguous() and not t.is_conj()
            and not t.is_neg())


def _array_ok(a):
    return a.flags.c_contiguous and dt.native_order(a)


class Client:
    """A connection to a dataplane cluster.

    cluster: a cluster file, a directory holding cluster.json, a registry URL
    ("etcd://host:port/NAME": the units' records, followed while the client
    lives), a list of unit addresses ("tcp://host:port", in unit order), or
    None for $DP_CLUSTER or the default directory. curve_secret: a CURVE
    secret key file for units that require one (None: $DP_CURVE_SECRET).
    timeout_s bounds each operation. inline_bytes: puts of at most that many
    bytes per unit, and a unit's get answer of at most that many bytes, travel
    inside the control messages (None: $DP_INLINE or 32 KiB; 0: never). The
    other options are the C library's (docs/client.md). A Client may be
    shared by threads (their calls take turns); it does not survive fork().
    """

    def __init__(self, cluster=None, *, timeout_s=30.0, connect_timeout_s=30.0,
                 staging_cache_bytes=0, crc=False, no_spill=False,
                 require_rdma=False, name=None, curve_secret=None, inline_bytes=None):
        for k, v in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s)):
            if not isinstance(v, (int, float)) or not 0 < v <= 1e6:
                raise ValueError(f"{k}: seconds in (0, 1e6] are needed, got {v!r}")
        if not isinstance(staging_cache_bytes, int) or not 0 <= staging_cache_bytes < 2**63:
            raise ValueError(f"staging_cache_bytes: bytes >= 0 are needed, got "
                             f"{staging_cache_bytes!r}")
        if inline_bytes is None:
            inl = 0  # the library's default
        elif (isinstance(inline_bytes, bool) or not isinstance(inline_bytes, int)
              or not 0 <= inline_bytes <= 1 << 20):
            raise ValueError(f"inline_bytes: bytes in [0, 1 MiB] (0: never) or None are "
                             f"needed, got {inline_bytes!r}")
        else:
            inl = inline_bytes if inline_bytes > 0 else 2**64 - 1  # DP_INLINE_OFF
        addrs = None
        if isinstance(cluster, (list, tuple)):
            addrs, cluster = list(cluster), None
        elif cluster is not None:
            cluster = os.fspath(cluster)
        if curve_secret is not None:
            curve_secret = os.fspath(curve_secret)
        self._c = _core.Client(cluster, addrs, float(timeout_s), float(connect_timeout_s),
                               int(staging_cache_bytes), bool(crc), bool(no_spill),
                               bool(require_rdma), name, curve_secret, inl)

    # -- lifecycle --

    def close(self):
        """Disconnect. Memory from alloc() stays valid until its last view dies."""
        self._c.close()

    @property
    def closed(self):
        return self._c.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def n_units(self):
        return self._c.n_units

    @property
    def replicas(self):
        """Copies of each row the cluster keeps (its units' --replicas): row g
        lives on units g % N, (g + 1) % N, ..."""
        return self._c.replicas

    def unit_address(self, i):
        return self._c.unit_address(i)

    # -- put --

    def put(self, rows, data, *, hints=False):
        """Put rows x fields. data maps each field to a tensor or array whose
        first dimension is len(rows), or to a list of one value per row
        (tensor, array, bytes, or None to leave that cell out). Raises a
        dataplane.Error; one whose batch landed in part has .landed (rows
        stored) and .rows (rows not stored). hints=True returns {field: [one
        location hint per row]} (bytes; None for a skipped cell): handed back
        to get_keys(keys, hints=...), a get skips looking up the keys."""
        r, fields, locs = self._put(rows, data, bool(hints))
        if not hints:
            return None
        return dict(zip(fields, _core.split_hints(locs, len(r), len(fields))))

    def _put(self, rows, data, want_locs, device=True):
        """put's work: (rows, fields, the library's row-major location hints
        as bytes, or None without want_locs). device: device tensors are
        staged (dataplane._device); its chunks' puts pass False."""
        if not isinstance(data, dict):
            raise TypeError(f"data: a dict field -> values is needed, got "
                            f"{type(data).__name__}")
        r = _rows(rows)
        n = len(r)
        fields = list(data)
        for f in fields:
            if not isinstance(f, str):
                raise TypeError(f"field names are str, got {f!r}")
        if device and any(_device.staged(v) for v in data.values()):
            return _device.put(self, [int(g) for g in r], data, want_locs)
        copies = _Copies(self)
        try:
            cols = [self._column(f, data[f], n, copies) for f in fields]
            copies.run()
            cols = [c[0] if isinstance(c, _Deferred) else c for c in cols]
            locs = self._c.put(r, fields, cols, want_locs)
        finally:
            copies.close()
        return r, fields, locs

    def _column(self, field, v, n, copies):
        if dt.is_tensor(v) or dt.is_array(v):
            shape = tuple(v.shape)
            if len(shape) == 0 or shape[0] != n:
                raise ValueError(
                    f"field '{field}': a tensor or array whose first dimension is "
                    f"len(rows) ({n}) is needed, or a list of {n} values; got shape "
                    f"{shape}")
            return self._strided(field, v, n, copies)
        if isinstance(v, (list, tuple)):
            if len(v) != n:
                raise ValueError(f"field '{field}': {len(v)} values for {n} rows")
            cells = [None] * n
            for i, x in enumerate(v):
                cells[i] = self._cell(field, i, x, cells, copies)
            return cells
        raise TypeError(f"field '{field}': a tensor, an array or a list of values per "
                        f"row is needed, got {type(v).__name__}")

    def _strided(self, field, v, n, copies):
        if dt.is_tensor(v):
            _dense(v, f"field '{field}'")
            name, kind = dt.torch_name(v.dtype), _core.KIND_TENSOR
            row_shape = tuple(v.shape[1:])
            row_nbytes = v[0].numel() * v.element_size() if n else 0
            if n == 0 or _tensor_ok(v):
                at = v.data_ptr()
                if at >= _device.NO_MEMORY or not row_nbytes:  # else lazy zeros: copied
                    return (0, at, row_nbytes, row_nbytes, kind, name, row_shape)
        else:
            name, kind = dt.numpy_name(v.dtype), _core.KIND_TENSOR
            row_shape = tuple(v.shape[1:])
            row_nbytes = v[0].nbytes if n else 0
            if _array_ok(v) or n == 0:
                return (0, v.__array_interface__["data"][0], row_nbytes, row_nbytes,
                        kind, name, row_shape)
        col = _Deferred([None])  # col[0] is set by copies.run()

        def place(addr):
            col[0] = (0, addr, row_nbytes, row_nbytes, kind, name, row_shape)

        copies.add(v, row_nbytes * n, place)
        return col

    def _cell(self, field, i, x, cells, copies):
        if x is None or isinstance(x, (bytes, bytearray, memoryview)):
            return x
        if isinstance(x, Encoded):
            return (x.data, _core.KIND_OBJECT, x.codec)
        if dt.is_tensor(x):
            _dense(x, f"row {i}, field '{field}'")
            name = dt.torch_name(x.dtype)
            nb = x.numel() * x.element_size()
            if _tensor_ok(x):
                at = x.data_ptr()
                if at >= _device.NO_MEMORY or not nb:  # else lazy zeros: copied
                    return (at, nb, _core.KIND_TENSOR, name, tuple(x.shape))
            shape = tuple(x.shape)

            def place(addr):
                cells[i] = (addr, nb, _core.KIND_TENSOR, name, shape)

            copies.add(x, nb, place)
            return None
        if dt.is_array(x) or (np is not None and isinstance(x, np.generic)):
            a = np.asarray(x)
            dt.numpy_name(a.dtype)  # a clear error for dtypes without a name
            if _array_ok(a):
                return a
            name, nb, shape = dt.numpy_name(a.dtype), a.nbytes, a.shape

            def place_a(addr):
                cells[i] = (addr, nb, _core.KIND_TENSOR, name, shape)

            copies.add(a, nb, place_a)
            return None
        raise TypeError(f"row {i}, field '{field}': cannot store a {type(x).__name__} "
                        f"(tensors, arrays, bytes or None; the TQ backend "
                        f"dataplane.tq also stores other objects)")

    # -- get --

    def get(self, rows, fields, *, out=None, stack=False):
        """{field: [value per row]} for rows x fields. Values come back as they
        were put (torch tensor, numpy array or bytes). out: {field: tensor or
        array of len(rows) rows, or a list of one per row} to receive into;
        the values returned are then views of it. stack=True: {field: one
        tensor or array of len(rows) rows} instead of lists (every value of a
        field must have the same dtype and shape; with out, the destination
        itself; without, a view of the fetched memory when each value is a
        multiple of 64 bytes, else one new contiguous tensor). Raises
        NotFound (a KeyError) naming missing keys."""
        if isinstance(fields, str):
            raise TypeError("fields: a list of field names is needed, got one str")
        fields = list(fields)
        r = _rows(rows)
        n = len(r)
        if out is not None:
            return self._get_out(r, fields, out, bool(stack))
        vals, rc, detail = self._c.get(r, fields)
        if rc:
            entries = vals.entries()
            keys = [f"{r[i % n]}@{fields[i // n]}" for i in range(len(entries))]
            _raise_get(rc, detail, entries, keys)
        res = {}
        for fi, f in enumerate(fields):
            base = fi * n

            def one(i, f=f, base=base):
                return value_of(vals.entry(i), r[i - base], f)

            res[f] = (_stacked(self._c, vals, base, n, one, f, r) if stack
                      else values_in_order(vals, base, n, one))
        return res

    def get_keys(self, keys, *, hints=None):
        """Values of "<gidx>@<field>" keys, in their order. hints: None, or one
        per key (None or a location hint put returned); a stale hint is only
        a missed shortcut, never a wrong value."""
        keys = list(keys)
        vals, rc, detail = self._c.get_keys(keys, hints)
        if rc:
            _raise_get(rc, detail, vals.entries(), keys)
        return values_in_order(vals, 0, len(keys),
                               lambda i: value_of(vals.entry(i), None, keys[i]))

    def _get_out(self, r, fields, out, stack, device=True):
        n = len(r)
        if not fields:
            return {}
        if device and any(f in out and _device.staged(out[f]) for f in fields):
            return _device.get_out(self, [int(g) for g in r], fields, out, stack)
        specs, views = [], []
        for f in fields:
            if f not in out:
                raise KeyError(f"out has no destination for field '{f}'")
            o = out[f]
            if isinstance(o, (list, tuple)):
                if stack:
                    raise ValueError(f"out['{f}']: stack=True needs one tensor or array "
                                     f"of {n} rows, not a list")
                if len(o) != n:
                    raise ValueError(f"out['{f}']: {len(o)} destinations for {n} rows")
                specs.append([_dst(d, f"{r[i]}@{f}") for i, d in enumerate(o)])
                views.append(list(o))
                continue
            if not (dt.is_tensor(o) or dt.is_array(o)) or len(o.shape) == 0 or len(o) != n:
                raise ValueError(f"out['{f}']: a tensor or array of {n} rows, or a list "
                                 f"of {n}, is needed")
            addr, nbytes = _dst(o, f"rows of {f}")
            row = nbytes // n if n else 0
            specs.append((addr, row, row))
            views.append(o)
        if n == 0:  # nothing to get: the (empty) destinations, or no values
            return {f: (o if stack else []) for f, o in zip(fields, views)}
        per_field, rc, detail = self._c.get_into_rows(r, fields, specs)
        if rc:
            items = []
            for fi, its in enumerate(per_field):
                items += its if isinstance(its, list) else [(0,)] * n
            keys = [f"{r[i % n]}@{fields[i // n]}" for i in range(len(items))]
            _raise_get(rc, detail, [(it[0],) for it in items], keys)
        res = {}
        for fi, f in enumerate(fields):
            its = per_field[fi]
            o = views[fi]
            if isinstance(its, tuple):  # every value landed alike: (kind, dtype, shape, nbytes)
                whole = None if isinstance(o, list) else _whole_rows(o, its, f, stack)
                if whole is not None:
                    res[f] = whole
                    continue
                its = [(0, its[3], its[0], its[1], its[2])] * n
            if stack:
                rows_are = f"{o.dtype}{tuple(o.shape[1:])}"
                odd = next((i for i, it in enumerate(its) if it[1:] != its[0][1:]), None)
                if odd is None:
                    raise ValueError(f"out['{f}']: stack=True: the values are "
                                     f"{_described(its[0])}, the rows of out {rows_are}")
                raise ValueError(
                    f"out['{f}']: stack=True needs every value a tensor of the rows' dtype "
                    f"and shape ({rows_are}); '{r[odd]}@{f}' is {_described(its[odd])}, "
                    f"'{r[0]}@{f}' {_described(its[0])}")
            if not isinstance(o, list):
                o = [o[i] for i in range(n)]
            res[f] = [_fit(o[i], its[i], f"{r[i]}@{f}") for i in range(n)]
        return res

    # -- clear, stats, memory --

    def clear(self, rows):
        """Drop every field of the rows; returns the number of values dropped."""
        return self._c.clear(_rows(rows))

    # -- checkpoints (docs/design.md, "Checkpoints") --

    def save(self, directory, *, keep=0, timeout_s=0.0):
        """Save every unit's data into a new checkpoint in directory (made if
        missing); it becomes the directory's current checkpoint only when
        this returns. keep > 0 removes all but the keep newest. The path must
        be the same on this host and the units' (one host or a shared
        filesystem). With replicas, each row is saved once (by its first
        unit). Returns a dict: checkpoint, n_units, replicas, copies (of each
        row in the files: 1), blobs, bytes."""
        return self._c.checkpoint(0, _ckpt_dir(directory), float(timeout_s), int(keep))

    def load(self, directory, *, timeout_s=0.0):
        """Load directory's current checkpoint into the cluster: every file is
        checked first; when the cluster has the checkpoint's number of units,
        the units load the shards themselves (each row's copies from its
        first unit's shard, whatever replicas either side keeps; a checkpoint
        made before one-copy saves needs the same replicas), else every value
        is put again through this client (re-homed: rows land on gidx % units
        and the units after it). Returns a dict: checkpoint, n_units,
        replicas, copies, blobs, bytes, loaded (blobs, every copy), spilled."""
        d = _ckpt_dir(directory)
        peek = self._c.checkpoint(3, d, float(timeout_s), 0)
        same = peek["n_units"] == self.n_units and (
            peek["copies"] == 1 or peek["replicas"] == self.replicas)
        return self._c.checkpoint(1 if same else 2, d, float(timeout_s), 0)

    def stats(self):
        """One dict of counters per unit."""
        lst, rc, detail = self._c.stats()
        if rc:
            e = make_error(rc, detail)
            e.stats = lst
            raise e
        return lst

    def unit_path(self, unit):
        """How this client's data path reaches unit `unit`: the lane class,
        one-sided or two-sided, and the UCX transports, e.g. "shm one-sided
        (posix,sysv)" or "tcp two-sided (tcp)"."""
        if not isinstance(unit, int) or isinstance(unit, bool) or unit < 0:
            raise ValueError(f"unit_path: a unit index >= 0 is needed, got {unit!r}")
        return self._c.unit_path(unit)

    def counters(self):
        """This client's own counters (restarts seen, re-binds, retained
        transfers, bytes this package copied...)."""
        return self._c.counters()

    def alloc(self, nbytes):
        """nbytes of registered memory (buffer protocol: numpy.frombuffer,
        torch.frombuffer). Values in it are put and got without a copy."""
        return self._c.alloc(nbytes)

    def register(self, obj):
        """Register a contiguous CPU tensor's or array's memory so values in it
        move without a staging copy. The object is kept alive until
        deregister(obj); if a failed transfer may still touch it, it is kept
        for good."""
        addr, nbytes = _span(obj)
        self._c._register(addr, nbytes, obj)

    def deregister(self, obj):
        """Deregister the region registered at obj's address (NotFound if none)."""
        self._c._deregister(_span(obj)[0])

    def _device_stage(self):
        """The host staging memory of device tensors (made on first use);
        raises Closed when the client is closed or was made in another
        process (before any lock of the parent's is taken)."""
        self._c._check()
        with _STAGE_LOCK:
            st = getattr(self, "_stage", None)
            if st is None:
                st = self._stage = _device.Stage()
        return st

    def touches_unfinished(self, obj):
        """True if a failed transfer may still write obj's memory (never reuse it)."""
        addr, nbytes = _span(obj)
        return self._c._touches_unfinished(addr, nbytes)


class Encoded:
    """A serialized object to put as it is: kind "object", dtype codec (e.g.
    "msgpack"); a get gives back its bytes (dataplane.tq decodes them)."""

    __slots__ = ("data", "codec")

    def __init__(self, data, codec):
        self.data, self.codec = data, codec


class _Deferred(list):
    """A strided column whose address is known once the copies ran."""

    pass


def _span(obj):
    if dt.is_tensor(obj):
        if not _tensor_ok(obj):
            raise ValueError("register: a contiguous CPU tensor is needed")
        if obj.numel() and obj.data_ptr() < _device.NO_MEMORY:
            raise ValueError("register: the tensor has no memory (torch's lazy zeros)")
        return obj.data_ptr(), obj.numel() * obj.element_size()
    if dt.is_array(obj):
        if not obj.flags.c_contiguous:
            raise ValueError("register: a C-contiguous array is needed")
        return obj.__array_interface__["data"][0], obj.nbytes
    raise TypeError(f"register: a tensor or array is needed, got {type(obj).__name__}")


def _dst(d, key):
    if dt.is_tensor(d):
        if not _tensor_ok(d):
            raise ValueError(f"out for '{key}': a contiguous CPU tensor is needed (a "
                             f"destination on a GPU must be one tensor of the field's "
                             f"rows)")
        at, nb = d.data_ptr(), d.numel() * d.element_size()
        if at < _device.NO_MEMORY and nb:
            raise ValueError(f"out for '{key}': the tensor has no memory to write (torch's "
                             f"lazy zeros, e.g. torch._efficientzerotensor); pass one made "
                             f"with torch.empty")
        return (at, nb)
    if dt.is_array(d):
        if not _array_ok(d) or not d.flags.writeable:
            raise ValueError(f"out for '{key}': a writable C-contiguous array of native "
                             f"byte order is needed")
        return (d.__array_interface__["data"][0], d.nbytes)
    raise TypeError(f"out for '{key}': a tensor or array is needed")


def _whole_rows(o, summary, field, stack):
    """The rows of a batch destination, as views in one call (or the
    destination itself when stack), when every value that landed in it is a
    tensor of its dtype and row shape (summary: their (kind, dtype, shape,
    nbytes)); else None."""
    kind, dtype, shape, nbytes = summary
    if kind != _core.KIND_TENSOR or shape != tuple(o.shape[1:]):
        return None
    _check_out_dtype(o, dtype, f"out['{field}']")
    if stack:
        return o
    return list(o.unbind(0)) if dt.is_tensor(o) else list(o)


def _described(item):
    _, nbytes, kind, dtype, shape = item[:5]
    if kind != _core.KIND_TENSOR:
        return f"{nbytes} bytes of kind {kind}"
    return f"{dtype}{tuple(shape)}"


def _stacked(cl, vals, i0, n, one, field, r):
    """Values i0 .. i0+n-1 (one field) as one contiguous tensor or array of n
    rows: a view of the fetched memory when they lie there in order and back
    to back (the library lays a get's values out in the keys' order, each at
    a multiple of 64 bytes: rows of a multiple of 64 bytes), else one new
    tensor they are copied into (in C, without the GIL). The new tensor lives
    in registered memory of the client (alloc): its buffers are cached, so a
    get does not pay for fresh pages each time, and a put of it moves without
    staging."""
    if n == 0:
        raise ValueError(f"field '{field}': stack=True needs at least one row")
    chains, rest = vals.runs(i0, n)
    if len(chains) == 1 and not rest and chains[0][1] == 1 and chains[0][5] == chains[0][6]:
        c = chains[0]
        block = _chain_block(c[3], c[4], c[5], c[6], c[2], c[7])
        if block is not None:
            return block  # the rows back to back in the fetched memory: no copy
    first = one(i0)
    if not (dt.is_tensor(first) or dt.is_array(first)):
        raise ValueError(f"field '{field}': stack=True needs tensors or arrays; "
                         f"'{r[0]}@{field}' is a {type(first).__name__}")
    shape = tuple(first.shape)
    is_t = dt.is_tensor(first)
    row = first.numel() * first.element_size() if is_t else first.nbytes
    count = n * (first.numel() if is_t else first.size)
    if row == 0:
        return (torch.empty((n,) + shape, dtype=first.dtype) if is_t
                else np.empty((n,) + shape, dtype=first.dtype))
    buf = cl.alloc(n * row)
    if is_t:
        out = torch.frombuffer(buf, dtype=first.dtype, count=count).view((n,) + shape)
        addr = out.data_ptr()
    else:
        out = np.frombuffer(buf, dtype=first.dtype, count=count).reshape((n,) + shape)
        addr = out.__array_interface__["data"][0]
    odd = vals.gather(i0, n, addr, row)
    if odd >= 0:
        v = one(i0 + odd)
        what = (f"{v.dtype}{tuple(v.shape)}" if dt.is_tensor(v) or dt.is_array(v)
                else f"a {type(v).__name__}")
        raise ValueError(f"field '{field}': stack=True needs every value of one dtype "
                         f"and shape; '{r[odd]}@{field}' is {what}, '{r[0]}@{field}' "
                         f"{first.dtype}{shape}")
    cl._count_copy(n * row)
    return out


def _check_out_dtype(view, dtype, what):
    """TypeError when a destination's element type is not the stored dtype's."""
    want = dt.torch_of(dtype) if dt.is_tensor(view) else dt.numpy_of(dtype)
    if want is not None and want != view.dtype:
        raise TypeError(f"{what} is {view.dtype}, the value is {dtype}")


def _fit(view, item, key):
    """The caller's destination, reshaped to the value that landed in it."""
    _, nbytes, kind, dtype, shape = item
    if kind != _core.KIND_TENSOR:  # bytes: the first nbytes of the destination
        if dt.is_tensor(view):
            return view.view(-1).view(torch.uint8)[:nbytes]
        return view.reshape(-1).view(np.uint8)[:nbytes]
    _check_out_dtype(view, dtype, f"out for '{key}'")
    if dt.is_tensor(view):
        if view.numel() * view.element_size() != nbytes:
            return view.view(-1)[: nbytes // view.element_size()].view(shape)
        return view.view(shape)
    if view.nbytes != nbytes:
        return view.reshape(-1)[: nbytes // view.itemsize].reshape(shape)
    return view.reshape(shape)


def _raise_get(rc, detail, entries, keys):
    missing = [k for e, k in zip(entries, keys) if e[0] == _core.DP_ENOTFOUND]
    failed = [k for e, k in zip(entries, keys) if e[0] not in (0, _core.DP_ENOTFOUND)]
    if failed:
        first = next(e[0] for e in entries if e[0] not in (0, _core.DP_ENOTFOUND))
        raise make_error(first, detail, keys=failed + missing)
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more"
                                      if len(missing) > 8 else "")
    raise make_error(_core.DP_ENOTFOUND, f"{len(missing)} key(s) not found: {shown}",
                     keys=missing)


def _maker(dtype):
    """("torch" or "numpy", element type) a stored dtype comes back as, or None."""
    if dtype.startswith("np_") and dt.numpy_of(dtype) is not None:
        return "numpy", dt.numpy_of(dtype)
    if dt.torch_of(dtype) is not None:
        return "torch", dt.torch_of(dtype)
    if dt.numpy_of(dtype) is not None:
        return "numpy", dt.numpy_of(dtype)
    return None


def _count(shape):
    count = 1
    for s in shape:
        count *= s
    return count


def value_of(e, row, field):
    """A fetched entry as a Python value: tensor, array or bytes."""
    _, kind, dtype, shape, nbytes, sl = e
    if kind != _core.KIND_TENSOR:
        return bytes(sl)
    size = dt.itemsize(dtype)
    if size is None:
        raise make_error(_core.DP_EUNSUPPORTED,
                         f"'{_key(row, field)}': stored dtype '{dtype}' is not one this "
                         f"package knows; read it from C")
    if _count(shape) * size != nbytes:
        raise make_error(_core.DP_EPROTO,
                         f"'{_key(row, field)}': {nbytes} bytes but shape {shape} of "
                         f"{dtype} needs {_count(shape) * size}")
    m = _maker(dtype)
    if m is None:
        raise make_error(_core.DP_EUNSUPPORTED,
                         f"'{_key(row, field)}': dtype '{dtype}' needs torch, which is "
                         f"not installed")
    if m[0] == "numpy":
        return np.frombuffer(sl, dtype=m[1]).reshape(shape)
    if nbytes == 0:
        return torch.empty(shape, dtype=m[1])
    t = torch.frombuffer(sl, dtype=m[1])
    return t if len(shape) == 1 else t.view(shape)


def _key(row, field):
    return f"{row}@{field}" if row is not None else field


LOC_BYTES = 128  # one location hint (the C library's dp_loc)


def values_in_order(vals, i0, n, one):
    """Values i0 .. i0+n-1 of a get, in order: each chain of tensors of one
    dtype and shape that lie one after another in the fetched memory (one
    unit's values of a field) becomes one strided tensor split into rows with
    one call (a tensor per value costs far more in torch); every other value
    through one(i), i absolute."""
    out = [None] * n
    chains, rest = vals.runs(i0, n)
    for start, step, count, dtype, shape, nbytes, stride, sl in chains:
        views = _chain_views(dtype, shape, nbytes, stride, count, sl)
        if views is None:
            rest.extend(range(start, start + step * count, step))
        else:
            out[start:start + step * (count - 1) + 1:step] = views
    if len(rest) >= 4 and torch is not None:
        _jagged_views(vals, i0, n, out)
        rest = [k for k in rest if out[k] is None]
    for k in rest:
        out[k] = one(i0 + k)
    return out


def _jagged_views(vals, i0, n, out):
    """Fill out with the 1-D tensors of one dtype and any lengths that lie one
    after another in the fetched memory (a jagged field: token ids, log
    probabilities): one tensor over each run split with one call, instead of
    a tensor made per value (about 2.5 us each). Values it cannot place this
    way stay None (made one by one, with their checks)."""
    for start, count, dtype, sizes, sl in vals.jagged(i0, n):
        m = _maker(dtype)
        if m is None or m[0] != "torch" or any(
                out[k] is not None for k in range(start, start + count)):
            continue
        if m[1].itemsize * sum(sizes) != len(memoryview(sl)):
            continue  # a description that does not match its bytes: one() says so
        pieces = torch.frombuffer(sl, dtype=m[1]).split(sizes)
        out[start:start + count] = pieces[0::2]


def _chain_block(dtype, shape, nbytes, stride, count, sl):
    """count values of dtype and shape at a stride in sl as one tensor or
    array of count rows (a view); None when the dtype is not one this package
    makes or its size does not match."""
    size = dt.itemsize(dtype)
    m = _maker(dtype)
    if size is None or m is None or _count(shape) * size != nbytes or stride % size:
        return None
    inner = []
    acc = 1
    for s in reversed(shape):
        inner.append(acc)
        acc *= s
    inner.reverse()
    if m[0] == "torch":
        t = torch.frombuffer(sl, dtype=m[1])
        return t.as_strided((count,) + shape, (stride // size,) + tuple(inner))
    a = np.frombuffer(sl, dtype=m[1])
    return np.lib.stride_tricks.as_strided(
        a, shape=(count,) + shape, strides=(stride,) + tuple(x * size for x in inner),
        writeable=True)


def _chain_views(dtype, shape, nbytes, stride, count, sl):
    """The values of a chain as one view each (see _chain_block), or None."""
    block = _chain_block(dtype, shape, nbytes, stride, count, sl)
    if block is None:
        return None
    if dt.is_tensor(block):
        return block.unbind(0)
    if not shape:  # rows of a 1-D array are scalars: 0-d arrays instead
        return [block[i:i + 1].reshape(()) for i in range(count)]
    return list(block)


def stack(values):
    """One tensor or array of a field's values whose shapes and dtypes agree."""
    if not values:
        raise ValueError("stack: no values")
    first = values[0]
    for i, v in enumerate(values):
        if tuple(v.shape) != tuple(first.shape) or v.dtype != first.dtype:
            raise ValueError(f"stack: value {i} is {v.dtype}{tuple(v.shape)}, value 0 "
                             f"is {first.dtype}{tuple(first.shape)}")
    if dt.is_tensor(first):
        return torch.stack(values)
    return np.stack(values)
