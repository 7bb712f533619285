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
(CUDA tensors are copied to host) and bytes move as they are; any other value
is stored as TransferQueue's own KV backends store it: msgpack (tuples come
back as lists), with pickle (cloudpickle for callables) for what msgpack
cannot hold (numpy scalars, object arrays, your classes).
config["allow_pickle"] = False refuses those, naming the key, and refuses to
unpickle what is stored: unpickling runs code, so a cluster others can write
to should run with it off.

Field names: any str TransferQueue accepts. Names the library refuses as they
are ('@', control characters, over 255 bytes, empty) and names starting with
'~' are stored under '~' + their base64url UTF-8 bytes, or, when that is too
long, '~~' + the hex SHA-256 of them.

put also takes the values as flatten(batch) makes them (the storage
manager registered as "Dataplane" hands them so): each tensor field then
moves as the one tensor it is, with no work per row.

put returns one location hint per key, the per-key backend metadata TQ
keeps and hands back to get as custom_backend_meta: a get of whole batches
then pins their blobs by id instead of looking every key up (a stale hint
costs a round trip, never a wrong value).

clear drops every field of the rows its keys name (TQ clears whole samples).

If TransferQueue is importable, importing this module (or register())
registers with TransferQueue, under the name "Dataplane": the storage client,
a storage manager (a KVStorageManager that uses it, hands its puts
flatten(batch) instead of a list of row views, gets off the event loop, and
saves and loads TransferQueue checkpoints) and a storage bootstrap provider
(tq.init attaches to the cluster the config names, or starts a local one).
An installed dataplane registers in every process by itself
(dataplane_tq_hook). docs/transferqueue.md has the configuration.
"""

import asyncio
import base64
import bisect
import collections.abc
import concurrent.futures
import enum
import hashlib
import operator
import os
import pickle
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref

from . import _core
from . import _dtypes as dt
from ._proc import die_with_parent, find_cli
from .client import LOC_BYTES, Client, Encoded, make_error, value_of, values_in_order

try:
    import msgpack
except ImportError:  # non-tensor values then go through pickle alone
    msgpack = None
try:
    import cloudpickle
except ImportError:  # callables then go through pickle (by reference)
    cloudpickle = None

_EXT_PICKLE, _EXT_CLOUDPICKLE = 1, 2  # msgpack extension types of a stored value

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
    etcd:// URL or list of unit addresses; default: $DP_CLUSTER or the
    default directory), "allow_pickle" (True: values msgpack cannot hold are
    pickled, as TQ does), "location_hints" (True: put returns a hint per
    key), and the Client options timeout_s, connect_timeout_s,
    staging_cache_bytes, crc, no_spill, require_rdma, name, inline_bytes.
    Other keys (TQ's own, e.g. client_name, and the bootstrap's units, slab,
    bind, cli) are ignored here.
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
        ap = config.get("allow_pickle", True)
        if not isinstance(ap, bool):
            raise ValueError(f"config['allow_pickle']: True or False is needed, got {ap!r} "
                             f"(a string such as 'false' would turn pickle on)")
        self.allow_pickle = ap
        lh = config.get("location_hints", True)
        if not isinstance(lh, bool):
            raise ValueError(f"config['location_hints']: True or False is needed, got {lh!r}")
        self.location_hints = lh
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
        """v as TransferQueue's KV backends store a non-tensor value: msgpack,
        tuples as lists, enums as their values, and pickle (cloudpickle for
        callables) inside it for what msgpack cannot hold, when allowed."""
        if msgpack is None:
            if self.allow_pickle:
                return Encoded(self._pickle(key, v), "pickle")
            raise TypeError(f"key '{key}': storing a {type(v).__name__} needs the msgpack "
                            f"package (or config['allow_pickle'] = True)")

        def other(o):
            if isinstance(o, tuple):
                return list(o)
            if isinstance(o, enum.Enum):
                return o.value
            if not self.allow_pickle:
                raise TypeError(
                    f"key '{key}': cannot store a {type(o).__name__} without pickle "
                    f"(msgpack holds str, int, float, bool, None, bytes, and lists, tuples "
                    f"and dicts of those); config['allow_pickle'] is False")
            if callable(o) and cloudpickle is not None:
                return msgpack.ExtType(_EXT_CLOUDPICKLE, self._pickle(key, o, cloudpickle))
            return msgpack.ExtType(_EXT_PICKLE, self._pickle(key, o))

        try:
            return Encoded(msgpack.packb(v, use_bin_type=True, strict_types=True,
                                         default=other), "msgpack")
        except (OverflowError, ValueError, RecursionError) as e:  # a huge int, a cycle
            if not self.allow_pickle:
                raise TypeError(f"key '{key}': a {type(v).__name__} msgpack cannot hold "
                                f"({e}) and config['allow_pickle'] is False") from None
            return Encoded(msgpack.packb(msgpack.ExtType(_EXT_PICKLE, self._pickle(key, v))),
                           "msgpack")

    @staticmethod
    def _pickle(key, v, mod=pickle):
        try:
            return mod.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as x:
            raise TypeError(f"key '{key}': a {type(v).__name__} does not pickle: {x}") from None

    def _unpickle(self, key, code, data):
        if code not in (_EXT_PICKLE, _EXT_CLOUDPICKLE):
            return msgpack.ExtType(code, data)
        if not self.allow_pickle:
            raise make_error(_core.DP_EPOLICY,
                             f"key '{key}' holds a pickled value and config['allow_pickle'] "
                             f"is False (unpickling runs code)")
        return pickle.loads(data)  # cloudpickle's output loads with pickle

    def _cell(self, gidx, field, v):
        if dt.is_tensor(v):
            if v.is_nested or v.layout != dt.torch.strided or v.device.type == "meta":
                raise TypeError(f"key '{gidx}@{field}': cannot store a "
                                f"{'nested' if v.is_nested else str(v.layout)} tensor on "
                                f"{v.device} (dense tensors only; unbind a nested one)")
            return v if v.device.type == "cpu" else v.detach().cpu()
        if dt.is_array(v):
            try:  # a dtype with a stored name moves as it is
                dt.numpy_name(v.dtype)
                return v
            except TypeError:  # object, str, datetime, structured: as TQ, an object
                return self._encode(f"{gidx}@{field}", v)
        if isinstance(v, (bytes, bytearray, memoryview)):
            return v
        return self._encode(f"{gidx}@{field}", v)

    def _decode(self, key, e):
        st, kind, dtype, shape, nbytes, sl = e
        if kind != _core.KIND_OBJECT:
            return value_of(e, None, key)
        if dtype == "msgpack" and msgpack is not None:
            try:
                return msgpack.unpackb(memoryview(sl), raw=False, strict_map_key=False,
                                       ext_hook=lambda c, d: self._unpickle(key, c, d))
            except _core.Error:
                raise
            except Exception as x:  # malformed bytes from the cluster
                raise make_error(_core.DP_EPROTO,
                                 f"key '{key}': stored msgpack does not decode: {x}")
        if dtype == "pickle":  # a whole value pickled (without msgpack, or older puts)
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
        try:
            row_list, fields, slots = _core.group_keys(keys)
        except ValueError:  # a field the library refuses as it is: its stored name
            stored = _stored_keys(keys)
            if stored is None:
                raise
            row_list, fields, slots = _core.group_keys(stored)
        else:
            if any(f.startswith("~") for f in fields):  # '~' names are escaped too
                row_list, fields, slots = _core.group_keys(_stored_keys(keys))
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
        if not self.location_hints:
            return None
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
        hints = _hints(custom_backend_meta, len(keys))
        if "@~" in "\n".join(keys):  # '~' names are stored escaped (one pass in C)
            keys = _stored_keys(keys) or keys
        vals, rc, detail = self._client._c.get_keys(keys, hints)
        if rc == _core.DP_EINVAL:  # a field the library refuses as it is: its stored name
            stored = _stored_keys(keys)
            if stored is not None:
                vals, rc, detail = self._client._c.get_keys(stored, hints)
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
        keys = list(keys)
        try:
            rows = _core.group_keys(keys, True)[0]
        except ValueError:  # a field the library refuses as it is
            stored = _stored_keys(keys)
            if stored is None:
                raise
            rows = _core.group_keys(stored, True)[0]
        rows = sorted(rows)
        if rows:
            self._client.clear(rows)


_FIELD_MAX = 255  # bytes of a field name the library takes (docs/design.md, "Keys")


def _stored_field(f):
    """The name field f is stored under: f itself when the library takes it
    and it does not start with '~'; else '~' + base64url of its UTF-8 bytes
    (no padding), or '~~' + their hex SHA-256 when that is longer than 255
    bytes. Injective: '~' never starts a name stored as it is, base64url has
    no '~', and a SHA-256 collision is not a practical concern."""
    b = f.encode("utf-8", "surrogatepass")
    if b and len(b) <= _FIELD_MAX and not f.startswith("~") and "@" not in f and all(
            0x20 <= ord(c) != 0x7F and not 0x80 <= ord(c) <= 0x9F for c in f):
        return f
    e = "~" + base64.urlsafe_b64encode(b).decode("ascii").rstrip("=")
    return e if len(e) <= _FIELD_MAX else "~~" + hashlib.sha256(b).hexdigest()


def _stored_keys(keys):
    """keys with each field part (after the first '@') as _stored_field
    names it, or None when that changes no key (the error was another)."""
    out, changed = [], False
    for k in keys:
        if not isinstance(k, str):
            return None
        g, at, f = k.partition("@")
        if not at:
            return None
        sf = _stored_field(f)
        changed |= sf is not f
        out.append(k if sf is f else f"{g}@{sf}")
    return out if changed else None


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


# -- TransferQueue: storage manager, bootstrap provider, registration --

def _cli_path(section):
    """The dataplane tool that starts a local cluster: the config's "cli",
    else as find_cli looks for it."""
    p = find_cli(section.get("cli"))
    if p is None:
        raise RuntimeError("Dataplane backend: no dataplane tool to start a local cluster; "
                           "set backend.Dataplane.cli (or $DP_CLI) to its path, or give "
                           "backend.Dataplane.cluster to attach to a running cluster")
    return p


def _stop_cluster(proc, directory, grace_s):
    """Stop a cluster `dataplane up` runs (SIGTERM, then SIGKILL after
    grace_s; its units stop with it) and remove its directory."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
    shutil.rmtree(directory, ignore_errors=True)


class LocalCluster:
    """A cluster this process started for TransferQueue (tq.init with no
    backend.Dataplane.cluster): `dataplane up` in a temporary directory. It
    stops when tq.close() drops it, at this process's exit, or by stop();
    its units never outlive this process (up stops them when it dies)."""

    def __init__(self, cli, units, slab, bind, start_timeout_s):
        self.directory = tempfile.mkdtemp(prefix="dataplane-tq-")
        self.cluster = os.path.join(self.directory, "cluster", "cluster.json")
        log_path = os.path.join(self.directory, "up.log")
        args = [cli, "up", "--units", str(units), "--slab", str(slab),
                "--dir", os.path.dirname(self.cluster)]
        if bind:
            args += ["--bind", str(bind)]
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        with open(log_path, "wb") as log:
            self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          env=env, preexec_fn=die_with_parent)
        self._finalizer = weakref.finalize(self, _stop_cluster, self._proc, self.directory, 15)
        deadline = time.monotonic() + start_timeout_s
        while not os.path.exists(self.cluster):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                with open(log_path, "rb") as f:
                    tail = f.read()[-2000:].decode(errors="replace")
                self.stop()
                raise RuntimeError(f"Dataplane backend: `{' '.join(args)}` did not start a "
                                   f"cluster within {start_timeout_s} s:\n{tail}")
            time.sleep(0.05)

    @property
    def pid(self):
        return self._proc.pid

    def stop(self):
        self._finalizer()


def bootstrap(conf):
    """TransferQueue's storage bootstrap for "Dataplane" (tq.init calls it
    once, in the process that starts TransferQueue). With
    backend.Dataplane.cluster set (a cluster file, directory, etcd:// URL
    or list of unit addresses), checks that the cluster answers and uses it;
    else starts a local cluster (units, slab, bind: 2, "1G", 127.0.0.1) and
    writes its cluster file into the config, which TransferQueue hands every
    process that attaches. Returns the LocalCluster, or None."""
    name = conf.backend.storage_backend
    if conf.backend.get(name) is None:
        conf.backend[name] = {}
    section = conf.backend[name]
    if section.get("cluster"):
        c = section.get("cluster")
        Client(c if isinstance(c, (str, os.PathLike)) else list(c),
               connect_timeout_s=float(section.get("connect_timeout_s") or 10)).close()
        return {"cluster": c, "started": False}
    local = LocalCluster(_cli_path(section), section.get("units") or 2,
                         section.get("slab") or "1G", section.get("bind") or "127.0.0.1",
                         float(section.get("start_timeout_s") or 60))
    section.cluster = local.cluster
    return local


def _rows_as_nested(rows):
    """rows (tensors of one dtype, >= 1 dims and one shape past the first,
    contiguous, lying one after another in memory that the first one's
    storage holds, none empty) as a jagged nested tensor over that memory,
    without a copy; else None."""
    torch = dt.torch
    first = rows[0]
    if type(first) is not torch.Tensor or first.dim() == 0 or first.layout != torch.strided:
        return None
    dtype, trail, es = first.dtype, first.shape[1:], first.element_size()
    last = rows[-1]
    if (type(last) is torch.Tensor and last.shape == first.shape and first.numel()
            and not first.is_complex()):
        # rows of one shape (a dense field): the check runs in C (about 1 us
        # a row, torch's attribute reads)
        if not _core.rows_of(rows, torch.Tensor, first.data_ptr(), first.numel() * es,
                             first.shape, dtype, False):
            return None
        lens = [first.shape[0]] * len(rows)
    else:  # jagged: row by row (only the addresses matter: as_strided below
        # checks that first's storage holds the whole range)
        ptr, lens = first.data_ptr(), []
        for t in rows:
            if (type(t) is not torch.Tensor or t.dtype != dtype or t.shape[1:] != trail
                    or t.data_ptr() != ptr or not t.is_contiguous() or t.numel() == 0):
                return None
            lens.append(t.shape[0])
            ptr += t.numel() * es
    strides, acc = [], 1  # contiguous strides of (rows, *trail)
    for d in reversed((0,) + tuple(trail)):
        strides.insert(0, acc)
        acc *= d
    try:
        flat = first.as_strided((sum(lens),) + tuple(trail), strides, first.storage_offset())
        offsets = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0)
        return torch.nested.nested_tensor_from_jagged(flat, offsets)
    except (RuntimeError, ValueError):  # past the storage's end, or torch refused
        return None


def _merge_field(rows, non_tensor_stack):
    """One field's rows as TransferQueue's KV manager merges them: objects in
    a NonTensorStack, 0-d tensors stacked, else a jagged nested tensor, else a
    strided one, else a NonTensorStack."""
    torch = dt.torch
    if not (isinstance(rows[0], torch.Tensor) and isinstance(rows[-1], torch.Tensor)):
        return non_tensor_stack(*rows)
    if all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in rows):
        return torch.stack(rows)
    for layout in (torch.jagged, torch.strided):
        try:
            return torch.nested.as_nested_tensor(rows, layout=layout)
        except (RuntimeError, TypeError):
            pass
    return non_tensor_stack(*rows)


def register():
    """Register the "Dataplane" storage client, storage manager and bootstrap
    provider with TransferQueue, if it is importable. Idempotent; True when
    registered. Importing this module calls it; an installed dataplane calls
    it in every process that imports transfer_queue (dataplane_tq_hook)."""
    global registered_with_tq
    if registered_with_tq:
        return True
    try:
        from transfer_queue.storage.clients import StorageClientFactory
        from transfer_queue.storage.managers.base import (KVStorageManager,
                                                          StorageManagerFactory)
    except Exception:
        return False
    StorageClientFactory.register("Dataplane")(DataplaneKVClient)
    try:
        from transfer_queue.storage.bootstrap import StorageBootstrapProvider
        StorageBootstrapProvider.register_provider("Dataplane")(bootstrap)
    except Exception:  # an older TransferQueue without bootstrap providers
        pass

    @StorageManagerFactory.register("Dataplane")
    class DataplaneStorageManager(KVStorageManager):
        """TQ's KV storage manager over DataplaneKVClient: its puts get
        flatten(batch) rather than a list of row views (each tensor field
        moves as one tensor), its gets run off the event loop (TQ calls the
        client's get on it), and TransferQueue's checkpoints save and load
        the cluster's data (into <checkpoint_dir>/dataplane)."""

        _generate_values = staticmethod(flatten)

        def __init__(self, controller_info, config, **kwargs):
            config = dict(config)
            config["client_name"] = "Dataplane"
            # TQ's controller keeps a hint per key and sends it with every
            # notify and batch: measured, that costs a put more than it spares
            # a get (docs/transferqueue.md, "Location hints"), so off unless asked for
            if config.get("location_hints") is None:
                config["location_hints"] = False
            super().__init__(controller_info, config, **kwargs)

        async def get_data(self, metadata):
            if not metadata.field_names:
                return await super().get_data(metadata)
            keys = self._generate_keys(metadata.field_names, metadata.global_indexes)
            shapes, dtypes, meta = self._get_shape_type_custom_backend_meta_list(metadata)
            values = await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.storage_client.get(keys=keys, shapes=shapes,
                                                      dtypes=dtypes,
                                                      custom_backend_meta=meta))
            return self._merge_tensors_to_tensordict(metadata, values)

        def _merge_tensors_to_tensordict(self, metadata, values):
            """The batch TQ's KV manager makes of a get's values (field by
            field, its rules), except that a field whose rows lie back to
            back in the fetched memory (one run per field: how a get places
            them) becomes a nested tensor over that memory instead of a copy
            of it. Measured: a 320 MiB get through TQ 258 -> 153 ms."""
            from tensordict import NonTensorStack, TensorDict
            n = len(metadata.global_indexes)
            fields = sorted(metadata.field_names)
            if len(values) != n * len(fields):
                return super()._merge_tensors_to_tensordict(metadata, values)
            out = {}
            for j, f in enumerate(fields):
                rows = values[j * n:(j + 1) * n]
                if rows:
                    out[f] = _rows_as_nested(rows)
                    if out[f] is None:
                        out[f] = _merge_field(rows, NonTensorStack)
            return TensorDict(out, batch_size=n)

        async def save_checkpoint(self, checkpoint_dir):
            d = os.path.join(os.fspath(checkpoint_dir), "dataplane")
            await asyncio.get_running_loop().run_in_executor(
                None, self.storage_client.client.save, d)

        async def load_checkpoint(self, checkpoint_dir):
            d = os.path.join(os.fspath(checkpoint_dir), "dataplane")
            if not os.path.isdir(d):
                raise FileNotFoundError(f"{checkpoint_dir} holds no dataplane checkpoint "
                                        f"(no {d}): it was saved with another backend")
            await asyncio.get_running_loop().run_in_executor(
                None, self.storage_client.client.load, d)

    globals()["DataplaneStorageManager"] = DataplaneStorageManager
    registered_with_tq = True
    return True


registered_with_tq = False
register()
