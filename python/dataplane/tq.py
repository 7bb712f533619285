"""dataplane.tq: a TransferQueue storage backend.

DataplaneKVClient implements TransferQueue's KV storage-client interface
(put, get, clear over "<global_index>@<field>" keys) by duck typing, so TQ's
KV storage manager can keep its samples on a dataplane cluster:

    from dataplane.tq import DataplaneKVClient
    kv = DataplaneKVClient({"cluster": "/run/user/1000/dataplane"})
    kv.put(["0@obs", "1@obs"], [t0, t1])
    t0, t1 = kv.get(["0@obs", "1@obs"])
    kv.clear(["0@obs", "1@obs"])

Values: torch tensors and numpy arrays of any dtype, shape and contiguity
(CUDA tensors are copied to host), bytes, and plain objects (str, int, float,
bool, None, and lists and dicts of those), which are stored with msgpack.
Anything else (tuples, numpy scalars, your classes) needs
config["allow_pickle"] = True: pickle from the network runs code, so it is off
by default and the error names the key and the type. Values come back as the
type they were put as.

put also takes the values as flatten(batch) makes them (the storage
manager registered as "Dataplane" hands them so): each tensor field then
moves as the one tensor it is, with no work per row.

put returns one location hint per key, the per-key backend metadata TQ
keeps and hands back to get as custom_backend_meta: a get of whole batches
then pins their blobs by id instead of looking every key up (a stale hint
costs a round trip, never a wrong value).

clear drops every field of the rows its keys name (TQ clears whole samples).

If TransferQueue is importable, importing this module registers the client
with TQ's StorageClientFactory as "Dataplane", and a storage manager
"Dataplane" (a KVStorageManager that uses it and hands its puts
flatten(batch) instead of a list of row views).
"""

import bisect
import collections.abc
import concurrent.futures
import operator
import os
import pickle
import threading

from . import _core
from . import _dtypes as dt
from .client import LOC_BYTES, Client, Encoded, make_error, value_of, values_in_order

try:
    import msgpack
except ImportError:  # plain objects then need allow_pickle
    msgpack = None

_CLIENT_OPTS = {
    "timeout_s": float, "connect_timeout_s": float, "staging_cache_bytes": int,
    "crc": bool, "no_spill": bool, "require_rdma": bool, "name": str,
    "inline_bytes": int,
}


_UNSET = object()  # a cell a put was not given (a TQ value may be None)


_STACK_ROW_MAX = 64 << 10  # rows under this that are not rows of one tensor are stacked
_PAR_MIN = 512 << 10  # stacks of this many bytes or more are shared among copy threads
_PAR_PIECE = 256 << 10  # at least this many bytes a thread


def _copy_threads():
    """Threads a put's stacking copies use: the library's DP_COPY_THREADS
    (which the client's open has checked), else 2 on 2 or more cores."""
    try:
        return max(1, min(16, int(os.environ["DP_COPY_THREADS"])))
    except (KeyError, ValueError):
        return 2 if (os.cpu_count() or 1) >= 2 else 1


def _rows_of_one_tensor(col):
    """One tensor whose rows are col's values, when they are tensors of one
    type, dtype and shape lying one after another in memory (TQ hands a batch
    field as list(tensor): views of one contiguous tensor), or None. The put
    then moves that tensor as it is: from the caller's memory straight into a
    same-host unit, or staged once by the library. col[0] is a dense
    (strided, not nested) tensor."""
    first = col[0]
    if (first.device.type == "meta" or not first.is_contiguous() or first.is_neg()
            or first.is_conj()):
        return None
    # each value must be exactly "row i": its place, dtype, shape and layout,
    # and no lazy negation or (complex) conjugation
    try:
        if not _core.rows_of(col, type(first), first.data_ptr(),
                             first.numel() * first.element_size(), first.shape, first.dtype,
                             first.is_complex()):
            return None
    except (RuntimeError, TypeError, ValueError, OverflowError):  # a read torch refused
        return None
    try:  # the rows as one tensor over first's storage
        return first.detach().as_strided((len(col),) + tuple(first.shape),
                                         (first.numel(),) + tuple(first.stride()),
                                         first.storage_offset())
    except RuntimeError:  # the rows lie beyond it (other storages side by side)
        return None


def _split(jobs, parts):
    """jobs [(j, col, out, row_bytes)] cut, in order, into at most `parts`
    lists of (j, col slice, out slice) of about equal bytes."""
    total = sum(len(col) * rb for _, col, _, rb in jobs)
    res = [[] for _ in range(parts)]
    done = 0  # bytes of the jobs before this one
    for j, col, out, rb in jobs:
        n, i = len(col), 0
        while i < n:
            p = min(parts - 1, (done + i * rb) * parts // total)
            end = (p + 1) * total // parts  # where part p ends, in bytes
            e = n if p == parts - 1 else min(n, max(i + 1, -(-(end - done) // rb)))
            res[p].append((j, col[i:e], out[i:e]))
            i = e
        done += n * rb
    return [r for r in res if r]


def _stack_part(part):
    """torch.stack each piece of part into its out; the job numbers of the
    pieces that do not fit their out (shapes that differ, a sparse or nested
    tensor, ...)."""
    bad = []
    with dt.torch.no_grad():  # out= refuses tensors that require grad otherwise
        for j, col, out in part:
            # torch.stack checks that a piece's values agree among themselves,
            # but resizes out (only warning) to fit values of another shape:
            # the values of a later piece may all be shorter than row 0
            shape, at = out.shape, out.data_ptr()
            if col[0].shape != shape[1:] or col[-1].shape != shape[1:]:
                bad.append(j)
                continue
            try:
                dt.torch.stack(col, out=out)
            except Exception:
                bad.append(j)
                continue
            if out.shape != shape or out.data_ptr() != at:
                bad.append(j)
    return bad


class Flattened(collections.abc.Sequence):
    """A batch's values in the order TQ's KV storage manager hands them to
    its storage client (its _generate_values): field by field, fields
    sorted, each field's rows in order; a nested tensor's rows are its
    unbind(), any other field's rows what iterating it gives.

    Unlike that list, a tensor field stays the one tensor it is, and its
    rows are made only when asked for (each the view TQ would make), so that
    DataplaneKVClient.put moves the tensor as it is instead of proving that
    thousands of row views are its rows. Anything else may index or iterate
    it as the list it stands for (each access makes a new view, so rows are
    equal but not identical objects). Use flatten(batch) to make one.
    """

    def __init__(self, batch):
        self.fields = sorted(batch.keys())
        self._cols, self._starts = [], [0]
        for f in self.fields:
            v = batch[f]
            if (dt.torch is not None and type(v) is dt.torch.Tensor and not v.is_nested
                    and v.layout == dt.torch.strided and v.dim() > 0):
                # an alias (v[...]): its size and memory are those of now, as
                # row views' are, even if v is resized or set_ later; rows are
                # made on demand (col[r] is the view iterating v gives)
                col = v[...]
            elif dt.is_tensor(v) and v.is_nested:
                col = list(v.unbind())
            else:
                try:
                    col = list(v)
                except TypeError as e:  # a 0-d tensor, a number, ...
                    raise TypeError(f"field '{f}': a tensor with a first dimension or "
                                    f"an iterable of rows is needed, got "
                                    f"{type(v).__name__} ({e})") from None
            self._cols.append(col)
            self._starts.append(self._starts[-1] + len(col))

    def __len__(self):
        return self._starts[-1]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = operator.index(i)  # TypeError for anything but an int
        n = len(self)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"index {i} out of range for {n} values")
        k = bisect.bisect_right(self._starts, j) - 1
        return self._cols[k][j - self._starts[k]]

    def __iter__(self):
        for col in self._cols:
            yield from col

    def columns(self, fields, n_rows):
        """Each field's column (its tensor, or a copy of its list of rows) when
        fields are this batch's fields in this order and each has n_rows
        rows, else None."""
        if list(fields) != self.fields or any(len(c) != n_rows for c in self._cols):
            return None
        return [c if dt.is_tensor(c) else list(c) for c in self._cols]


def flatten(batch):
    """batch (a TensorDict, or any mapping field -> tensor or sequence of
    rows) as the values TQ's KV storage manager would hand a put: a
    Flattened sequence, which DataplaneKVClient.put moves field by field
    (docs/design.md, "Python package": TransferQueue)."""
    return Flattened(batch)


class DataplaneKVClient:
    """TQ's KV storage client over a dataplane cluster.

    config (a dict, or TQ's DictConfig): "cluster" (cluster file, directory,
    or list of unit addresses; default: $DP_CLUSTER or the default
    directory), "allow_pickle" (False), and the Client options timeout_s,
    connect_timeout_s, staging_cache_bytes, crc, no_spill, require_rdma,
    name, inline_bytes. Other keys (TQ's own, e.g. client_name) are ignored.
    """

    def __init__(self, config=None):
        config = {} if config is None else config
        self.config = config
        opts = {}
        for k, typ in _CLIENT_OPTS.items():
            v = config.get(k)
            if v is not None:
                if typ is not str and isinstance(v, str):
                    raise ValueError(f"config['{k}']: a {typ.__name__} is needed, got "
                                     f"{v!r}")
                opts[k] = typ(v)
        ap = config.get("allow_pickle", False)
        if not isinstance(ap, bool):
            raise ValueError(f"config['allow_pickle']: True or False is needed, got {ap!r} "
                             f"(a string such as 'false' would turn pickle on)")
        self.allow_pickle = ap
        cluster = config.get("cluster")
        if cluster is not None and not isinstance(cluster, (str, os.PathLike)):
            cluster = list(cluster)  # unit addresses (e.g. a ListConfig)
        self._client = Client(cluster, **opts)
        self._threads = _copy_threads()
        self._executor = None
        self._pool_lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        self._counts = collections.Counter()  # how puts moved their columns

    @property
    def client(self):
        return self._client

    def close(self):
        with self._pool_lock:
            ex, self._executor, self._closed = self._executor, None, True
        if ex is not None and self._pid == os.getpid():
            ex.shutdown()
        self._client.close()

    # -- values --

    def _encode(self, key, v):
        if v is None or isinstance(v, (str, int, float, bool, list, dict)):
            if msgpack is not None:
                try:
                    return Encoded(msgpack.packb(v, use_bin_type=True,
                                                 strict_types=True), "msgpack")
                except (TypeError, ValueError, OverflowError):
                    pass  # a tuple, a big int, an object inside: pickle or refuse
        if self.allow_pickle:
            try:
                return Encoded(pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL), "pickle")
            except Exception as x:
                raise TypeError(f"key '{key}': a {type(v).__name__} does not pickle: {x}")
        raise TypeError(
            f"key '{key}': cannot store a {type(v).__name__} without pickle (tensors, "
            f"arrays, bytes, str, int, float, bool, None, lists and dicts of those); "
            f"set config['allow_pickle'] = True to store it with pickle (unpickling "
            f"runs code: only for trusted clusters)")

    def _cell(self, gidx, field, v):
        if dt.is_tensor(v):
            if v.is_nested or v.layout != dt.torch.strided or v.device.type == "meta":
                raise TypeError(f"key '{gidx}@{field}': cannot store a "
                                f"{'nested' if v.is_nested else str(v.layout)} tensor on "
                                f"{v.device} (dense tensors only; unbind a nested one)")
            return v if v.device.type == "cpu" else v.detach().cpu()
        if dt.is_array(v) or isinstance(v, (bytes, bytearray, memoryview)):
            return v
        return self._encode(f"{gidx}@{field}", v)

    def _decode(self, key, e):
        st, kind, dtype, shape, nbytes, sl = e
        if kind != _core.KIND_OBJECT:
            return value_of(e, None, key)
        if dtype == "msgpack" and msgpack is not None:
            try:
                return msgpack.unpackb(memoryview(sl), raw=False, strict_map_key=False)
            except Exception as x:  # malformed bytes from the cluster
                raise make_error(_core.DP_EPROTO,
                                 f"key '{key}': stored msgpack does not decode: {x}")
        if dtype == "pickle":
            if not self.allow_pickle:
                raise make_error(_core.DP_EPOLICY,
                                 f"key '{key}' was stored with pickle; set "
                                 f"config['allow_pickle'] = True to read it (unpickling "
                                 f"runs code)")
            return pickle.loads(memoryview(sl))
        return bytes(sl)

    # -- the interface --

    def put(self, keys, values):
        """Store values[i] under keys[i]. values is a sequence, or what
        flatten(batch) made of a batch (its tensor fields then move whole).
        Returns the per-key backend metadata: one location hint (bytes) per
        key, which TQ hands back to get as custom_backend_meta so that the
        get skips looking the keys up."""
        keys = list(keys)
        flat = values if isinstance(values, Flattened) else None
        if flat is None:
            values = list(values)
        if len(keys) != len(values):
            raise ValueError(f"put: {len(keys)} keys and {len(values)} values")
        # rows and fields in order of first appearance; slots: cell (f, r)'s key index
        row_list, fields, slots = _core.group_keys(keys)
        n = len(row_list)
        cols = None
        if flat is not None:
            if _core.field_major(slots, n):  # key i names value i: TQ's order
                cols = flat.columns(fields, n)
            if cols is None:
                values = list(flat)  # keyed otherwise: the list it stands for
        if cols is None:
            cols = _core.columns(values, slots, n, _UNSET)
        data, stack, counts = {}, [], collections.Counter()
        for f, col in zip(fields, cols):
            data[f] = col
            if dt.is_tensor(col):  # a batch tensor of flatten(): Client.put takes it
                counts["batch"] += 1
                continue
            first = col[0]
            if (n > 1 and dt.is_tensor(first) and not first.is_nested
                    and first.layout == dt.torch.strided):
                nb = first.numel() * first.element_size()
                whole = _rows_of_one_tensor(col) if nb else None
                if whole is not None:
                    data[f] = whole
                    counts["rows"] += 1
                    continue
                # a jagged column (the last value's shape differs) is not
                # tried: torch's refusal costs milliseconds (it records a
                # backtrace)
                if (0 < nb < _STACK_ROW_MAX and dt.is_tensor(col[-1])
                        and col[-1].shape == first.shape
                        and _core.same_kind(col, type(first), first.dtype)):
                    stack.append(f)
                    continue
            counts["values"] += 1
            self._cells(row_list, f, col)
        try:
            if stack:  # data's stacked columns keep the registered memory under them
                counts.update(self._stage(stack, data, row_list))
            locs = self._client._put(row_list, data, True)[2]
        except (TypeError, ValueError) as e:
            if isinstance(e, _core.Error):  # the library's: it names rows or keys itself
                raise
            raise _naming_the_key(e, row_list, data) from e
        with self._pool_lock:
            self._counts.update(counts)
        return _core.key_hints(locs, slots, n, len(keys))

    def counters(self):
        """The client's counters (Client.counters()) and how this adapter's
        puts that succeeded moved their columns: columns_batch (a tensor field of
        flatten(batch), moved whole), columns_rows (row views proven to be
        the rows of one tensor, moved as that tensor), columns_stacked (small
        rows stacked into registered memory), columns_values (value by
        value)."""
        out = self._client.counters()
        with self._pool_lock:
            for k in ("batch", "rows", "stacked", "values"):
                out["columns_" + k] = self._counts[k]
        return out

    def _cells(self, row_list, f, col):
        """col's values, one by one, in the forms Client.put takes."""
        for r, v in enumerate(col):
            col[r] = None if v is _UNSET else self._cell(row_list[r], f, v)

    def _stage(self, fields, data, row_list):
        """Stack each column of fields (CPU tensors of one type and dtype, rows
        under 64 KiB) into one tensor over registered memory of the client:
        torch copies the values as they are (any strides, lazy conjugation or
        negation) and checks their shapes, in C++ for the whole column, far
        cheaper than looking at each value here; the rows are shared among
        the copy threads (torch releases the GIL while it copies). A column
        torch refuses goes value by value. The stacked columns are views that
        keep the buffer alive (torch.frombuffer holds it); the library keeps
        what a failed WRITE touched."""
        jobs, total = [], 0
        for f in fields:
            first = data[f][0]
            nb = len(data[f]) * first.numel() * first.element_size()
            jobs.append((f, total, nb))
            total += (nb + 63) // 64 * 64
        buf = self._client._c.alloc(total)
        work = []
        for j, (f, off, nb) in enumerate(jobs):
            col, first = data[f], data[f][0]
            out = dt.torch.frombuffer(buf, dtype=dt.torch.uint8, count=nb, offset=off)
            out = out.view(first.dtype).view((len(col),) + tuple(first.shape))
            work.append((j, col, out, nb // len(col)))
        parts = _split(work, max(1, min(self._threads, total // _PAR_PIECE))
                       if total >= _PAR_MIN else 1)
        pool = self._pool() if len(parts) > 1 else None
        here, futs = (list(parts[:1]) if pool else list(parts)), []
        for p in (parts[1:] if pool else []):
            try:
                futs.append(pool.submit(_stack_part, p))
            except RuntimeError:  # shut down by a close meanwhile: here then
                here.append(p)
        bad = set()
        try:
            for p in here:
                bad.update(_stack_part(p))
        finally:
            for fu in futs:  # every copy into buf ends before buf can go
                bad.update(fu.result())
        for j, col, out, _ in work:
            f = jobs[j][0]
            if j in bad:
                self._cells(row_list, f, col)
            else:
                data[f] = out
        self._client._c._count_copy(sum(jobs[j][2] for j, *_ in work if j not in bad))
        return {"stacked": len(work) - len(bad), "values": len(bad)}

    def _pool(self):
        """The copy threads' pool (threads - 1 workers), or None in a forked
        child (its threads are the parent's: the put then fails as the
        client's calls do there)."""
        if self._pid != os.getpid():
            return None
        with self._pool_lock:
            if self._closed:
                return None  # the put then fails as a closed client's calls do
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self._threads - 1, thread_name_prefix="dataplane-tq")
            return self._executor

    def get(self, keys, shapes=None, dtypes=None, custom_backend_meta=None,
            custom_meta=None):
        """The values of keys, in their order. shapes and dtypes (TQ passes one
        per key, None for non-tensor fields) are checked against what is
        stored, and a tensor is given the requested shape when its element
        count matches (TQ records 1-D fields' rows as shape (1,)). Raises
        KeyError (dataplane.NotFound) naming missing keys and ValueError for
        malformed ones."""
        keys = list(keys)  # the library checks each key (InvalidArgument, a ValueError)
        for k in keys:
            if not isinstance(k, str):
                raise ValueError(f"key {k!r}: a str '<global_index>@<field>' is needed")
        vals, rc, detail = self._client._c.get_keys(keys, _hints(custom_backend_meta,
                                                                len(keys)))
        if rc:
            from .client import _raise_get
            _raise_get(rc, detail, vals.entries(), keys)
        out = values_in_order(vals, 0, len(keys),
                              lambda i: self._decode(keys[i], vals.entry(i)))
        for name, lst in (("shapes", shapes), ("dtypes", dtypes)):
            if lst is not None and len(lst) != len(keys):
                raise ValueError(f"get: {len(lst)} {name} for {len(keys)} keys")
        if shapes is not None or dtypes is not None:
            tensor = dt.torch.Tensor if dt.torch is not None else ()
            for i, v in enumerate(out):
                shape = None if shapes is None else shapes[i]
                dtype = None if dtypes is None else dtypes[i]
                if (type(v) is tensor and (dtype is None or v.dtype == dtype)
                        and (shape is None or v.shape == shape)):
                    continue  # as asked: the common case, without a call
                out[i] = self._conform(keys[i], v, shape, dtype)
        return out

    def _conform(self, key, v, shape, dtype):
        if shape is None and dtype is None:
            return v
        if not dt.is_tensor(v):
            if dtype is not None:  # TQ asks for a tensor of this dtype
                what = f"a {v.dtype} array" if dt.is_array(v) else f"a {type(v).__name__}"
                raise ValueError(f"key '{key}': {what} is stored, asked for a {dtype} "
                                 f"tensor")
            return v
        if dtype is not None and v.dtype != dtype:
            raise ValueError(f"key '{key}': stored {v.dtype}, asked for {dtype}")
        if shape is not None and v.shape != shape and tuple(v.shape) != tuple(shape):
            want = 1
            for s in shape:
                want *= int(s)
            if want != v.numel():
                raise ValueError(f"key '{key}': stored shape {tuple(v.shape)}, asked "
                                 f"for {tuple(shape)}")
            v = v.view(tuple(shape))
        return v

    def clear(self, keys, custom_backend_meta=None, custom_meta=None):
        """Drop the rows the keys name (every field of each). Keys never put
        are fine."""
        rows = sorted(_core.group_keys(list(keys), True)[0])
        if rows:
            self._client.clear(rows)


def _naming_the_key(e, row_list, data):
    """e (a value refused by the put: a dtype without a stored name, too many
    dims) again, naming the first key whose value is refused so; e itself if
    none is found. Only on the error path: a put checks no value twice."""
    for f, col in data.items():
        whole = dt.is_tensor(col) or dt.is_array(col)
        for r, v in enumerate([col] if whole else col):
            if not (dt.is_tensor(v) or dt.is_array(v)):
                continue
            try:
                dt.torch_name(v.dtype) if dt.is_tensor(v) else dt.numpy_name(v.dtype)
                why = None if v.ndim - whole <= _core.SHAPE_MAX else (
                    f"{v.ndim - whole} dims (at most {_core.SHAPE_MAX})")
            except TypeError as x:
                why = str(x)
            if why is not None:
                also = f" (as every value of field '{f}')" if whole else ""
                return type(e)(f"key '{row_list[r]}@{f}'{also}: {why}")
    return e


def _hints(meta, n):
    """The location hints in TQ's custom_backend_meta (what put returned, one
    per key), or None. Items that are not a hint of ours (None, or metadata of
    another shape) are just not used."""
    if meta is None:
        return None
    if not isinstance(meta, (list, tuple)):
        return None
    if len(meta) != n:
        raise ValueError(f"get: {len(meta)} custom_backend_meta items for {n} keys")
    out = [m if isinstance(m, bytes) and len(m) == LOC_BYTES else None for m in meta]
    return out if any(m is not None for m in out) else None


def _register_with_tq():
    """Register with TransferQueue's factories when TQ is installed."""
    try:
        from transfer_queue.storage.clients import StorageClientFactory
    except Exception:
        return False
    StorageClientFactory.register("Dataplane")(DataplaneKVClient)
    try:
        from transfer_queue.storage.managers.base import (KVStorageManager,
                                                          StorageManagerFactory)
    except Exception:
        return True

    @StorageManagerFactory.register("Dataplane")
    class DataplaneStorageManager(KVStorageManager):
        """TQ's KV storage manager over DataplaneKVClient, whose puts get
        flatten(batch) rather than a list of row views: each tensor field
        moves as one tensor."""

        _generate_values = staticmethod(flatten)

        def __init__(self, controller_info, config, **kwargs):
            config = dict(config)
            config["client_name"] = "Dataplane"
            super().__init__(controller_info, config, **kwargs)

    globals()["DataplaneStorageManager"] = DataplaneStorageManager
    return True


registered_with_tq = _register_with_tq()
