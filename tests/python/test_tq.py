"""The TransferQueue backend driven as TQ's KV storage manager drives it.

TQ (not installable here) builds keys field-major with fields sorted
("<global_index>@<field>"), hands per-row views of each batch tensor (0-d for
1-D fields, rows of a nested tensor for jagged fields, Python objects for
non-tensor fields), runs put in the event loop's default executor (several at
once), calls get synchronously on the loop thread with one shape and dtype
per key (torch.Size, a tuple for jagged rows, (1,) for a 1-D field's rows,
None for non-tensor fields) and the per-key metadata put returned, and
clears whole samples. This test does exactly that against real units and
checks every value.
"""

import asyncio

import numpy as np
import pytest

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
import torch

from dataplane.tq import DataplaneKVClient, Flattened, flatten
import dataplane


def _keys(gidxs, fields):
    return [f"{g}@{f}" for f in sorted(fields) for g in gidxs]


def _values(batch, gidxs):
    """TQ's _generate_values: field-major, one entry per (field, row)."""
    out = []
    for f in sorted(batch):
        v = batch[f]
        if isinstance(v, torch.Tensor) and v.is_nested:
            out.extend(v.unbind())
        elif isinstance(v, torch.Tensor):
            out.extend(v)  # per-row views; 0-d for a 1-D field
        else:
            out.extend(v)
    return out


def _shapes_dtypes(batch, n):
    shapes, dtypes = [], []
    for f in sorted(batch):
        v = batch[f]
        if isinstance(v, torch.Tensor) and v.is_nested:
            rows = v.unbind()
            shapes += [tuple(r.shape) for r in rows]
            dtypes += [v.dtype] * n
        elif isinstance(v, torch.Tensor):
            row = v.shape[1:] if v.dim() > 1 else torch.Size([1])  # TQ's unsqueeze
            shapes += [row] * n
            dtypes += [v.dtype] * n
        else:
            shapes += [None] * n
            dtypes += [None] * n
    return shapes, dtypes


def _batch(base, n):
    g = torch.Generator().manual_seed(base)
    lens = [int(x) for x in torch.randint(1, 300, (n,), generator=g)]
    return {
        "input_ids": torch.nested.nested_tensor(
            [torch.randint(0, 50000, (k,), generator=g) for k in lens]),
        "attention_mask": torch.ones(n, 16, dtype=torch.bool),
        "logprobs": torch.randn(n, 16, generator=g).t().contiguous().t(),  # non-contiguous
        "reward": torch.randn(n, generator=g),                    # 1-D: 0-d rows
        "hidden": torch.randn(n, 4, 8, generator=g, dtype=torch.float32).to(torch.bfloat16),
        "prompt": [f"prompt {base + i} \u00e9" for i in range(n)],   # non-tensor
        "meta": [{"step": base + i, "tags": ["a", None], "ok": i % 2 == 0}
                 for i in range(n)],
    }


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(
            a.reshape(b.shape), b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("values_of", ["tq", "flatten"])
def test_driven_as_tq_kv_storage_manager(cluster, values_of):
    """TQ's KV storage manager (values: a list of row views), and the
    "Dataplane" manager (values: flatten(batch))."""
    kv = DataplaneKVClient({"cluster": cluster, "client_name": "Dataplane",
                            "timeout_s": 20})
    n = 24
    parts = [list(range(1000 + 100 * p, 1000 + 100 * p + n)) for p in range(4)]
    batches = [_batch(p, n) for p in range(4)]
    make = _values if values_of == "tq" else (lambda b, g: flatten(b))

    async def put_all():
        loop = asyncio.get_running_loop()
        futs = [loop.run_in_executor(None, kv.put, _keys(g, b), make(b, g))
                for g, b in zip(parts, batches)]
        return await asyncio.gather(*futs)

    metas = asyncio.run(put_all())
    for m, g, b in zip(metas, parts, batches):
        assert m is None or len(m) == len(_keys(g, b))

    async def get_on_loop(g, b, meta):
        keys = _keys(g, b)
        shapes, dtypes = _shapes_dtypes(b, len(g))
        cbm = meta if meta else [None] * len(keys)
        return kv.get(keys=keys, shapes=shapes, dtypes=dtypes, custom_backend_meta=cbm)

    for g, b, m in zip(parts, batches, metas):
        got = asyncio.run(get_on_loop(g, b, m))
        want = _values(b, g)
        assert len(got) == len(want)
        for k, x, y in zip(_keys(g, b), want, got):
            assert _same(x, y), k
        # the shapes TQ asked for: (1,) for the 1-D field's rows
        shapes, _ = _shapes_dtypes(b, len(g))
        for k, y, s in zip(_keys(g, b), got, shapes):
            if s is not None:
                assert tuple(y.shape) == tuple(s), k
        # TQ's merge: regular fields stack, jagged ones nest
        i = sorted(b).index("logprobs") * len(g)
        assert torch.equal(torch.stack(got[i:i + len(g)]), b["logprobs"])

    # clear whole samples, as TQ's clear_samples does; keys never put are fine
    g, b = parts[0], batches[0]
    kv.clear(keys=_keys(g, b) + ["999999@never"], custom_backend_meta=None)
    with pytest.raises(KeyError) as e:
        kv.get(keys=_keys(g[:1], b))
    assert f"{g[0]}@attention_mask" in str(e.value)
    # the other parts are untouched
    got = kv.get(keys=_keys(parts[1], batches[1]))
    assert all(_same(x, y) for x, y in zip(_values(batches[1], parts[1]), got))
    for g in parts[1:]:
        kv.clear(_keys(g, batches[0]))
    cnt = kv.counters()
    dense = 4 * 4  # four batches: attention_mask, logprobs, reward, hidden
    if values_of == "flatten":  # moved whole; input_ids, prompt, meta value by value
        assert (cnt["columns_batch"], cnt["columns_values"]) == (dense, 4 * 3)
    else:
        assert cnt["columns_batch"] == 0
        assert cnt["columns_rows"] + cnt["columns_stacked"] == dense
    kv.close()


def _same_view(a, b):
    """a and b are the same value: for tensors, the same view of the same
    memory (as TQ's iteration makes it), else equal objects of one type."""
    if isinstance(a, torch.Tensor):
        return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
                and a.stride() == b.stride() and a.data_ptr() == b.data_ptr()
                and a.is_neg() == b.is_neg() and a.is_conj() == b.is_conj())
    return type(a) is type(b) and a == b


def test_flatten_stands_for_tqs_value_list():
    """flatten(batch) is, value for value, the list TQ's KV storage manager
    makes (_generate_values), only made on demand: the same views of the same
    memory, nested rows, non-tensor items; indexing, slicing, iterating."""
    b = _batch(5, 7)
    b["neg"] = torch._neg_view(torch.randn(7, 2))
    b["arr"] = list(np.arange(14).reshape(7, 2))  # a field of arrays (TQ: NonTensorStack)
    want = _values(b, None)
    flat = flatten(b)
    assert isinstance(flat, Flattened) and len(flat) == len(want) == 9 * 7
    assert flat.fields == sorted(b)
    for i, w in enumerate(want):
        got = flat[i]
        if isinstance(w, np.ndarray):
            assert type(got) is np.ndarray and np.array_equal(got, w), i
        else:
            assert _same_view(w, got), i
        assert _same_view(flat[i - len(want)], got) if not isinstance(w, np.ndarray) else True
    assert all(_same_view(x, y) for x, y in zip(want, flat) if not isinstance(x, np.ndarray))
    assert [type(x) for x in flat[3:40:5]] == [type(x) for x in want[3:40:5]]
    for bad in (len(want), -len(want) - 1):
        with pytest.raises(IndexError, match=f"index {bad} out of range for {len(want)}"):
            flat[bad]
    with pytest.raises(TypeError):
        flat["0"]
    with pytest.raises(TypeError, match="field 'z': a tensor with a first dimension"):
        flatten({"a": torch.zeros(2), "z": torch.tensor(3.)})
    # a field of another row count: no columns (the put then goes by the list)
    assert flatten({"a": torch.zeros(3, 2), "b": torch.zeros(4, 2)}).columns(["a", "b"], 3) is None
    assert flat.columns(list(reversed(flat.fields)), 7) is None


def test_flatten_put_moves_tensor_fields_whole(cluster):
    """A put of flatten(batch) under TQ's keys moves each dense tensor field
    as the tensor it is: from alloc() memory with no copy at all, without
    looking at its rows; other fields go value by value; keys in another
    order than the values' make the put go by the list flatten stands for."""
    kv = DataplaneKVClient({"cluster": cluster})
    c = kv.client
    n = 64
    buf = c.alloc(n * 256 * 4)
    reg = torch.frombuffer(buf, dtype=torch.float32).view(n, 256)
    reg.copy_(torch.randn(n, 256, generator=torch.Generator().manual_seed(11)))
    batch = {"reg": reg, "t": torch.randn(n, 3, 5).transpose(1, 2),  # non-contiguous
             "nest": torch.nested.nested_tensor([torch.ones(i % 5 + 1) for i in range(n)]),
             "txt": [f"row {i}" for i in range(n)]}
    g = list(range(3800, 3800 + n))
    # reg moves from registered memory, t is copied once (not contiguous)
    two = {"reg": reg, "t": batch["t"]}
    before = c.counters()
    kv.put(_keys(g, two), flatten(two))
    after = kv.counters()
    assert after["columns_batch"] == 2 and after["columns_values"] == 0
    assert after["staged_put_bytes"] - before["staged_put_bytes"] == 0
    assert after["copied_bytes"] - before["copied_bytes"] == batch["t"].numel() * 4
    keys = _keys(g, batch)
    kv.put(keys, flatten(batch))
    after = kv.counters()
    assert after["columns_batch"] == 4 and after["columns_values"] == 2
    want = _values(batch, g)
    for k, w, got in zip(keys, want, kv.get(keys)):
        assert _same(w, got), k
    # row-major keys: key i still names value i, as with any sequence
    rm = [f"{r}@{f}" for r in range(3900, 3900 + n) for f in sorted(batch)]
    kv.put(rm, flatten(batch))
    assert kv.counters()["columns_batch"] == 4  # not moved whole this time
    for k, w, got in zip(rm, want, kv.get(rm)):
        assert _same(w, got), k
    with pytest.raises(ValueError, match="keys and"):
        kv.put(keys[:-1], flatten(batch))
    # the batch resized or set_ to other memory after flatten(): what is put
    # is what the rows were at flatten(), as with TQ's row views (an
    # independent probe found the resized tensor's rows put, shifted)
    for change in ("grow", "shrink", "set"):
        t = torch.arange(6.).reshape(3, 2)
        b = {"a": t, "b": torch.tensor([100., 101., 102.])}
        want = _values(b, None)
        fl = flatten(b)
        if change == "grow":
            t.resize_(4, 2)
            t[3] = -1
        elif change == "shrink":
            t.resize_(2, 2)
        else:
            t.set_(torch.full((3, 2), 7.))
        ks = [f"{3950 + i}@{f}" for f in "ab" for i in range(3)]
        assert len(fl) == len(list(fl)) == 6
        kv.put(ks, fl)
        for k, w, got in zip(ks, want, kv.get(ks)):
            assert _same(w, got), (change, k)
        kv.clear(ks)
    kv.clear(keys + rm)
    del reg
    kv.close()


def _by_blob(kv):
    return sum(u["resolves_by_blob"] for u in kv.client.stats())


def test_location_hints_fresh_stale_and_cleared(cluster):
    """put's per-key metadata are location hints: handed back, a get pins
    whole blobs instead of looking keys up. Stale ones (rows overwritten or
    cleared since) only cost the shortcut: the values are the current ones.
    (A batch this small would otherwise come inline, by key: inline is off.)"""
    kv = DataplaneKVClient({"cluster": cluster, "timeout_s": 20, "inline_bytes": 0})
    g = list(range(5000, 5032))
    b = _batch(7, len(g))
    keys = _keys(g, b)
    meta = kv.put(keys, _values(b, g))
    assert len(meta) == len(keys) and all(isinstance(m, bytes) and len(m) == 128
                                          for m in meta)
    shapes, dtypes = _shapes_dtypes(b, len(g))
    m0, r0 = kv.client.counters()["loc_misses"], _by_blob(kv)
    got = kv.get(keys, shapes, dtypes, custom_backend_meta=meta)
    assert all(_same(x, y) for x, y in zip(_values(b, g), got))
    assert kv.client.counters()["loc_misses"] == m0  # every hint used
    assert _by_blob(kv) == r0 + 2  # one resolve by blob per unit, no lookup

    # a hint of another key is not used for this one
    swapped = list(meta)
    swapped[0], swapped[1] = meta[1], meta[0]
    got = kv.get(keys, shapes, dtypes, custom_backend_meta=swapped)
    assert all(_same(x, y) for x, y in zip(_values(b, g), got))
    assert kv.client.counters()["loc_misses"] >= m0 + 2

    # overwrite half the rows: old hints are stale, values are the new ones
    b2 = _batch(8, 16)
    kv.put(_keys(g[:16], b2), _values(b2, g[:16]))
    got = kv.get(keys, custom_backend_meta=meta)
    new = dict(zip(_keys(g[:16], b2), _values(b2, g[:16])))
    old = dict(zip(keys, _values(b, g)))
    for k, y in zip(keys, got):
        assert _same(new.get(k, old[k]), y), k

    # cleared: a KeyError naming the key, hints or not
    kv.clear(_keys(g[16:], b))
    with pytest.raises(KeyError) as e:
        kv.get(keys[-1:], custom_backend_meta=meta[-1:])
    assert keys[-1] in str(e.value)

    # hints that are not ours are ignored; a malformed one of ours is refused
    got = kv.get(_keys(g[:16], b2), custom_backend_meta=[{"x": 1}] * len(_keys(g[:16], b2)))
    assert len(got) == len(_keys(g[:16], b2))
    bad = bytearray(meta[0])
    bad[2] = ord("/")
    with pytest.raises(ValueError) as e:
        kv.get(keys[:1], custom_backend_meta=[bytes(bad)])
    assert "location hint is malformed" in str(e.value)
    with pytest.raises(ValueError):
        kv.get(keys[:2], custom_backend_meta=meta[:1])
    kv.clear(_keys(g, b))
    kv.close()


def test_client_put_hints_round_trip(cluster):
    c = dataplane.Client(cluster, timeout_s=20)
    rows = list(range(6000, 6010))
    t = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    h = c.put(rows, {"x": t, "y": [b"v%d" % i if i % 2 else None for i in range(10)]},
              hints=True)
    assert set(h) == {"x", "y"} and len(h["x"]) == 10
    assert h["y"][0] is None and isinstance(h["y"][1], bytes)
    keys = [f"{r}@x" for r in rows]
    m0 = c.counters()["loc_misses"]
    got = c.get_keys(keys, hints=h["x"])
    assert all(torch.equal(g, t[i]) for i, g in enumerate(got))
    assert c.counters()["loc_misses"] == m0
    with pytest.raises(TypeError):
        c.get_keys(keys[:1], hints=[3])
    c.clear(rows)
    c.close()


def test_hints_of_colliding_keys_and_changed_hints_are_not_used(cluster):
    """A hint is sealed with a 64-bit hash of its key and its bytes: the hint
    of a key whose CRC32C is the same as this key's (these two collide), or a
    hint changed after the put (another value's offset in the same blob,
    another dtype or shape), is not used: the value is looked up by key."""
    kv = DataplaneKVClient({"cluster": cluster, "timeout_s": 20, "inline_bytes": 0})
    keys = ["10301000@82c490b18386b539", "10301000@846da43b98d32499", "10301000@third"]
    vals = [torch.arange(8, dtype=torch.float32), torch.full((4,), -1, dtype=torch.int64),
            torch.ones(2, 2, dtype=torch.float16)]
    meta = kv.put(keys, vals)
    assert meta[0][60:64] == meta[1][60:64]  # their key_crc: the CRC32C collides
    assert meta[0][:40] == meta[1][:40] and meta[0][40:48] != meta[1][40:48]  # one blob
    m0 = kv.client.counters()["loc_misses"]
    changed = [meta[1], meta[0]]  # each other's hints (the same key CRC)
    for m, k in ((meta[0], 40), (meta[0], 66), (meta[2], 88)):  # offset, dtype, shape
        b = bytearray(m)
        b[k:k + 8] = meta[1][k:k + 8] if k != 66 else b"int32\0\0\0"
        changed.append(bytes(b))
    tries = [(keys[0], changed[0]), (keys[1], changed[1]), (keys[0], changed[2]),
             (keys[0], changed[3]), (keys[2], changed[4])]
    for key, hint in tries:
        got = kv.get([key], custom_backend_meta=[hint])[0]
        want = vals[keys.index(key)]
        assert got.dtype == want.dtype and torch.equal(got, want), key
    assert kv.client.counters()["loc_misses"] == m0 + len(tries)
    kv.clear(keys)
    kv.close()


class _Thing:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, _Thing) and other.x == self.x


def test_non_tensor_values_as_tq_stores_them(cluster):
    """As TransferQueue's KV backends: msgpack (tuples come back as lists,
    enums as their values), pickle for the rest (cloudpickle for callables);
    allow_pickle=False refuses those, naming the key, and will not unpickle."""
    import enum

    class Color(enum.IntEnum):
        RED = 1

    kv = DataplaneKVClient({"cluster": cluster})
    np = pytest.importorskip("numpy")
    vals = [(1, 2), {"t": (3, (4,))}, Color.RED, _Thing(3), {1, 2}, np.float64(2.5),
            np.array([{"a": 1}, None], dtype=object), 2**70, len]
    keys = [f"{3000 + i}@obj" for i in range(len(vals))]
    kv.put(keys, vals)
    got = kv.get(keys)
    assert got[:3] == [[1, 2], {"t": [3, [4]]}, 1] and type(got[2]) is int
    assert got[3] == _Thing(3) and got[4] == {1, 2} and got[7] == 2**70 and got[8] is len
    assert type(got[5]) is np.float64 and got[5] == 2.5
    assert got[6].dtype == object and got[6][0] == {"a": 1} and got[6][1] is None
    off = DataplaneKVClient({"cluster": cluster, "allow_pickle": False})
    for v in [_Thing(3), {1, 2}, np.float64(1), 2**70, {"x": [_Thing(1)]}]:
        with pytest.raises(TypeError) as e:
            off.put(["3100@obj"], [v])
        assert "3100@obj" in str(e.value) and "allow_pickle" in str(e.value)
    with pytest.raises(KeyError):  # nothing was stored
        off.get(["3100@obj"])
    off.put(["3100@obj"], [(1, "a")])  # msgpack alone: fine without pickle
    assert off.get(["3100@obj"]) == [[1, "a"]]
    with pytest.raises(dataplane.PolicyError) as e:  # a pickled value needs pickle on
        off.get(["3003@obj"])
    assert "allow_pickle" in str(e.value) and "3003@obj" in str(e.value)
    with pytest.raises(ValueError, match="allow_pickle"):
        DataplaneKVClient({"cluster": cluster, "allow_pickle": "false"})
    kv.clear(keys + ["3100@obj"])
    kv.close()
    off.close()


def test_any_field_name_tq_accepts(cluster):
    """Field names the library refuses as they are ('@', control characters,
    over 255 bytes, empty) and names starting with '~' are stored under an
    escaped name: put, get and clear see the names TransferQueue gave."""
    from dataplane.tq import _stored_field

    kv = DataplaneKVClient({"cluster": cluster})
    odd = ["a@b", "tab\there", "nul\x00", "\x85c1", "x" * 300, "é" * 200, "", "~", "~x",
           _stored_field("a@b"), "plain"]
    assert len({_stored_field(f) for f in odd}) == len(odd)  # injective
    keys = [f"{3400 + r}@{f}" for f in odd for r in range(2)]
    vals = [torch.full((3,), float(i)) for i in range(len(keys))]
    hints = kv.put(keys, vals)
    for h in (hints, None):
        got = kv.get(keys, custom_backend_meta=h)
        assert all(torch.equal(a, b) for a, b in zip(got, vals))
    kv.clear(["3400@a@b"])  # the row, every field of it
    with pytest.raises(KeyError):
        kv.get(["3400@~x"])
    assert torch.equal(kv.get(["3401@~x"])[0], vals[keys.index("3401@~x")])
    kv.clear(["3401@" + "x" * 300])
    kv.close()


def test_plain_values_keep_their_types(cluster):
    kv = DataplaneKVClient({"cluster": cluster})
    vals = ["s", "", 0, -5, 2**63 - 1, 1.5, float("inf"), True, False, None, b"\x00raw",
            [1, [2, "x"], None], {"a": {"b": [1.0]}, "n": None}, {7: "int key"}, []]
    keys = [f"{3100 + i}@v" for i in range(len(vals))]
    kv.put(keys, vals)
    got = kv.get(keys)
    for k, a, b in zip(keys, vals, got):
        assert type(a) is type(b) and a == b, (k, a, b)
    # numpy values stay numpy
    np = pytest.importorskip("numpy")
    arr = np.arange(6, dtype=np.uint16).reshape(2, 3)[:, ::2]  # non-contiguous
    kv.put(["3200@np"], [arr])
    (back,) = kv.get(["3200@np"])
    assert isinstance(back, np.ndarray) and back.dtype == np.uint16
    assert np.array_equal(back, arr)
    kv.clear(keys + ["3200@np"])
    kv.close()


def test_bad_keys_and_arguments(cluster):
    kv = DataplaneKVClient({"cluster": cluster})
    for bad in ["x@f", "01@f", "-1@f", "1", "@f", "1 @f", 7]:
        with pytest.raises(ValueError):
            kv.put([bad], [torch.zeros(1)])
        with pytest.raises(ValueError):
            kv.get([bad])
    with pytest.raises(ValueError):
        kv.put(["1@a", "1@a"], [torch.zeros(1), torch.ones(1)])
    with pytest.raises(ValueError):
        kv.put(["1@a"], [])
    with pytest.raises(ValueError):  # a dtype other than the stored one
        kv.put(["3300@t"], [torch.zeros(3)])
        kv.get(["3300@t"], shapes=[(3,)], dtypes=[torch.int64])
    with pytest.raises(ValueError):
        kv.get(["3300@t"], shapes=[(4,)], dtypes=[torch.float32])
    with pytest.raises(ValueError):
        DataplaneKVClient({"cluster": cluster, "timeout_s": "soon"})
    kv.clear(["3300@t"])
    # clear checks its keys as put and get do: a bad one drops nothing
    kv.put(["3301@a"], [torch.ones(2)])
    for bad in ["x@a", "3301", "01@a", "3301 @a"]:
        with pytest.raises(ValueError) as e:
            kv.clear([bad, "3301@a"])
        assert repr(bad) in str(e.value)  # the bad key is named
    assert torch.equal(kv.get(["3301@a"])[0], torch.ones(2))
    # a value whose dtype has no stored name, or with too many dims: the key is named
    # (kept as objects with pickle, as TransferQueue does; refused without)
    off = DataplaneKVClient({"cluster": cluster, "allow_pickle": False})
    for v in [np.array([object()]), np.zeros(2, dtype=[("a", "i4")]),
              np.array(["2020-01-01"], dtype="datetime64[D]"), np.array(["ab"])]:
        with pytest.raises(TypeError, match="key '3302@n'"):
            off.put(["3301@b", "3302@n"], [torch.ones(1), v])
        kv.put(["3301@b", "3302@n"], [torch.ones(1), v])
        back = kv.get(["3302@n"])[0]
        assert back.dtype == v.dtype and back.shape == v.shape
        if v.dtype != object:  # (an object() pickles to a new object)
            assert back.tobytes() == v.tobytes()
    off.close()
    with pytest.raises(ValueError, match=r"key '3302@d': 33 dims \(at most 32\)"):
        kv.put(["3302@d"], [torch.zeros([1] * 33)])
    with pytest.raises(ValueError, match=r"key '3302@d' \(as every value of field 'd'\)"):
        kv.put(["3302@d", "3303@d"], [torch.zeros([1] * 33)] * 2)
    kv.clear(["3301@a", "3301@b"])
    kv.close()


def test_tq_registration_when_importable():
    import dataplane.tq as tq
    try:
        import transfer_queue  # noqa: F401
    except ImportError:
        assert tq.registered_with_tq is False
        return
    from transfer_queue.storage.clients import StorageClientFactory
    assert StorageClientFactory._registry["Dataplane"] is tq.DataplaneKVClient


def test_rows_of_one_tensor_keep_their_layout(cluster):
    """Rows handed as views of one tensor are stored as the rows, not as the
    tensor under them: transposed, permuted, conjugated and negated views."""
    kv = DataplaneKVClient({"cluster": cluster})
    x = torch.arange(36.).view(4, 3, 3).clone()
    z = torch.complex(torch.randn(4, 2), torch.randn(4, 2))
    cases = {
        "tr": list(x.transpose(1, 2)), "perm": list(x.permute(0, 2, 1)),
        "mt": list(x.mT), "conj": list(z.conj()), "neg": list(torch._neg_view(x)),
        "plain": list(x), "cols": list(x[:, :, 1]),
    }
    for f, rows in cases.items():
        keys = [f"{3400 + i}@{f}" for i in range(4)]
        kv.put(keys, rows)
        for k, want, got in zip(keys, rows, kv.get(keys)):
            assert torch.equal(got, want.resolve_conj().resolve_neg()), k
    kv.clear([f"{3400 + i}@x" for i in range(4)])
    kv.close()


def _round_trip(kv, base, cols):
    """put {field: values} as TQ keys of rows base.., get them back; each
    value must come back with the dtype, shape and elements it was put with."""
    keys, values = [], []
    for f, col in cols.items():
        for i, v in enumerate(col):
            if v is not None:
                keys.append(f"{base + i}@{f}")
                values.append(v)
    kv.put(keys, values)
    for k, want, got in zip(keys, values, kv.get(keys)):
        want = want.detach().resolve_conj().resolve_neg()
        assert got.dtype == want.dtype and got.shape == want.shape, k
        assert torch.equal(got, want), k
    return keys


def test_stacked_columns_store_each_value_as_put(cluster):
    """Columns of rows under 64 KiB that are not the rows of one tensor are
    stacked by torch into registered memory (one copy, counted); whatever the
    values are, each comes back as it was put: views of one tensor or separate tensors, any layout, lazily
    conjugated or negated, requiring grad, 0-d, of mixed dtypes or shapes (value
    by value then), with cells missing, and big enough that the copy threads
    share the stacking."""
    kv = DataplaneKVClient({"cluster": cluster})
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 3, 5, generator=g)
    z = torch.complex(torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g))
    cols = {
        "views": list(x), "sep": [torch.randn(3, 5, generator=g) for _ in range(6)],
        "tr": list(x.transpose(1, 2)), "conj": list(z.conj()),
        "neg": list(torch._neg_view(x)), "grad": list(x.clone().requires_grad_()),
        "d0": list(torch.arange(6.)), "bool": list(x > 0), "bf16": list(x.to(torch.bfloat16)),
        "mixdt": [x[0], x[1].double(), x[2].half(), x[3], x[4].to(torch.int32), x[5]],
        "jag": [torch.randn(i + 1, generator=g) for i in range(6)],
        "jagmid": [torch.randn(3 + (i == 2), generator=g) for i in range(6)],  # torch refuses
        "holes": [x[0], None, x[2], None, x[4], x[5]],
        "zeros": list(torch._efficientzerotensor(6, 3)),  # no memory: data pointer 0
    }
    copied = kv.client.counters()["copied_bytes"]
    _round_trip(kv, 3700, {"views": cols["views"]})  # rows of one tensor: put as it
    assert kv.client.counters()["copied_bytes"] == copied
    _round_trip(kv, 3700, {"sep": cols["sep"]})  # separate tensors: stacked, one copy
    assert kv.client.counters()["copied_bytes"] - copied == x.numel() * 4
    keys = _round_trip(kv, 3700, cols)
    # 2 fields x 160 rows x 2 KiB: the stacking is shared among threads
    big = {f: list(torch.randn(160, 512, generator=g)) for f in ("b0", "b1")}
    keys += _round_trip(kv, 3710, big)
    # jagged rows in runs of one length, the later ones shorter (a GRPO batch:
    # each prompt's samples alike), each run in its own thread's piece
    runs = [torch.randn(4000, generator=g) for _ in range(32)] + [
        torch.randn(1000, generator=g) for _ in range(32)]
    keys += _round_trip(kv, 4000, {"runs": runs})
    with pytest.raises(TypeError, match="3721@sp"):  # torch refuses: value by value
        kv.put(["3720@sp", "3721@sp"], [torch.zeros(3), torch.eye(3)[0].to_sparse()])
    nt = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(TypeError, match="3722@nest.*nested"):
        kv.put(["3722@nest", "3723@nest"], [nt, nt])
    kv.clear(keys)
    kv.close()


def test_big_rows_checked_in_place(cluster):
    """Rows that are views of one tensor are stored from that tensor (here
    64 KiB rows in registered memory: nothing copied); a value that only looks
    like row i (another row, another shape, dtype or layout over the same
    bytes, a lazy negation) is stored as itself."""
    kv = DataplaneKVClient({"cluster": cluster})
    c = kv.client
    buf = c.alloc(4 * 16384 * 4)
    b = torch.frombuffer(buf, dtype=torch.float32).view(4, 16384)
    b.copy_(torch.randn(4, 16384, generator=torch.Generator().manual_seed(8)))
    before = c.counters()["copied_bytes"]
    keys = _round_trip(kv, 3730, {"reg": list(b)})
    assert c.counters()["copied_bytes"] == before
    odd = [(1, b[3]), (2, b[2].view(128, 128)), (1, b[1][:100]), (2, b[2].view(torch.int32)),
           (1, b.as_strided((16384,), (2,), 16384)),  # row 1's place, every other element
           (2, torch._neg_view(b[2]))]
    for k, (i, bad) in enumerate(odd):
        col = list(b)
        col[i] = bad
        keys += _round_trip(kv, 3740 + 10 * k, {"odd": col})
    kv.clear(keys)
    del b
    kv.close()


def test_refused_put_reports_no_row_landed(cluster):
    kv = DataplaneKVClient({"cluster": cluster})
    with pytest.raises(dataplane.Error) as e:  # bigger than a unit can ever hold
        kv.put(["3500@ok", "3501@huge"], ["small", torch.zeros(300 << 20, dtype=torch.uint8)])
    assert e.value.landed == [] and sorted(e.value.rows) == [3500, 3501]
    with pytest.raises(KeyError):
        kv.get(["3500@ok"])
    kv.close()


def test_config_and_argument_checks(cluster):
    for bad in ["false", "0", 1, "yes"]:
        with pytest.raises(ValueError):
            DataplaneKVClient({"cluster": cluster, "allow_pickle": bad})
    kv = DataplaneKVClient({"cluster": cluster})
    kv.put(["3600@t"], [torch.zeros(2)])
    with pytest.raises(ValueError):
        kv.get(["3600@t"], shapes=[], dtypes=None)
    with pytest.raises(ValueError):
        kv.get(["3600@t"], shapes=None, dtypes=[torch.float32, torch.float32])
    with pytest.raises(ValueError):  # a non-tensor asked for as a tensor
        kv.put(["3601@s"], ["text"])
        kv.get(["3601@s"], shapes=[(3,)], dtypes=[torch.float32])
    for bad in [b"1@f", 1.5]:
        with pytest.raises(ValueError):
            kv.put([bad], [torch.zeros(1)])
        with pytest.raises(ValueError):
            kv.clear([bad])
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    for v in [nested, torch.zeros(3).to_sparse(), torch.empty(3, device="meta")]:
        with pytest.raises(TypeError) as e:
            kv.put(["3602@odd"], [v])
        assert "3602@odd" in str(e.value)
    kv.clear(["3600@t", "3601@s"])
    kv.close()


def _group_ref(keys, repeats=False):
    """group_keys in Python: rows and fields in order of first appearance,
    {(field, row): key index} (the first when repeats)."""
    rows, fields, cell = [], [], {}
    for i, k in enumerate(keys):
        g, f = k.split("@", 1)
        g = int(g)
        if g not in rows:
            rows.append(g)
        if f not in fields:
            fields.append(f)
        at = (fields.index(f), rows.index(g))
        if at in cell and not repeats:
            raise ValueError(k)
        cell.setdefault(at, i)
    return rows, fields, cell


def test_key_grouping_matches_a_reference():
    """The adapter's per-key work in C (group_keys, columns, field_major,
    key_hints) against plain Python, over keys in TQ's orders and shuffled
    ones, rows ascending or not, cells missing and keys repeated."""
    import os
    import random
    import sys
    from dataplane import _core
    seed = int(os.environ.get("DP_TEST_SEED", random.randrange(1 << 30)))
    print(f"DP_TEST_SEED={seed}")
    rnd = random.Random(seed)
    from dataplane.client import LOC_BYTES as loc
    for trial in range(60):
        nr, nf = rnd.randint(1, 40), rnd.randint(1, 5)
        gidx = rnd.sample(range(10 ** 6), nr)
        if trial % 3 == 0:
            gidx.sort()  # TQ's batches: ascending
        fields = [f"f{j}" for j in range(nf)]
        keys = [f"{g}@{f}" for f in fields for g in gidx]  # field-major
        if trial % 4 == 1:
            keys = [f"{g}@{f}" for g in gidx for f in fields]  # row-major
        elif trial % 4 == 2:
            rnd.shuffle(keys)
        elif trial % 4 == 3:
            keys = [k for k in keys if rnd.random() < 0.7] or keys[:1]  # holes
        rows, flds, cell = _group_ref(keys)
        r, f, slots = _core.group_keys(keys)
        assert (r, f) == (rows, flds), seed
        n = len(r)
        assert len(slots) == len(f) * n * 8
        vals = [object() for _ in keys]
        fill = object()
        cols = _core.columns(vals, slots, n, fill)
        for fi in range(len(f)):
            for ri in range(n):
                i = cell.get((fi, ri))
                assert cols[fi][ri] is (fill if i is None else vals[i]), seed
        major = all(cell.get((fi, ri)) == fi * n + ri for fi in range(len(f)) for ri in range(n))
        assert _core.field_major(slots, n) is major, seed
        # hints: cell (r, f) of put's row-major hints goes to its key
        locs = bytearray(n * len(f) * loc)
        for ri in range(n):
            for fi in range(len(f)):
                o = (ri * len(f) + fi) * loc
                locs[o:o + 8] = b"b%03d%03d\0" % (ri, fi) if (fi, ri) in cell else b"\0" * 8
        hints = _core.key_hints(bytes(locs), slots, n, len(keys))
        for (fi, ri), i in cell.items():
            assert hints[i][:8] == b"b%03d%03d\0" % (ri, fi), seed
        if trial % 5 == 0 and len(keys) > 1:  # a repeated key
            k2 = keys + [keys[0]]
            with pytest.raises(ValueError, match="appears twice"):
                _core.group_keys(k2)
            assert _core.group_keys(k2, True)[:2] == (r, f)
    # slots that are not group_keys' for those rows
    r, f, slots = _core.group_keys(["1@a", "2@a"])
    for bad in (slots[:-1], list(slots), (5).to_bytes(8, sys.byteorder) + slots[8:],
                (-2).to_bytes(8, sys.byteorder, signed=True) + slots[8:]):
        with pytest.raises(ValueError):
            _core.columns([1, 2], bad, 2, None)
    with pytest.raises(ValueError):
        _core.field_major(slots, 3)
    with pytest.raises(ValueError):
        _core.key_hints(bytes(2 * loc), slots, 2, 1)  # key index 1 of 1 key


def test_rows_merged_as_nested_without_a_copy():
    """The "Dataplane" manager's merge: rows lying back to back in one
    storage become a nested tensor over that memory; anything else merges as
    TransferQueue's KV manager does (copies, stacks, NonTensorStack)."""
    from dataplane.tq import _merge_field, _rows_as_nested
    tensordict = pytest.importorskip("tensordict")
    base = torch.arange(60, dtype=torch.float32)
    rows = [base[0:10], base[10:25], base[25:60]]  # jagged, back to back
    nt = _rows_as_nested(rows)
    assert nt is not None and nt.is_nested and nt.values().data_ptr() == base.data_ptr()
    assert [list(r) for r in nt.unbind()] == [list(r) for r in rows]
    block = torch.randn(4, 3, 5)  # rows of 2-D values, one tensor under them
    nt = _rows_as_nested(list(block))
    assert nt is not None and torch.equal(torch.stack(list(nt.unbind())), block)
    # not back to back, another storage, a gap, another dtype, 0-d, empty: no
    other = torch.arange(10, dtype=torch.float32)
    for bad in ([base[0:10], base[11:20]], [base[0:10], other], [base[0:10], base[10:20].int()],
                [torch.tensor(1.0), torch.tensor(2.0)], [base[0:0], base[0:5]],
                [base[0:10], "x"]):
        assert _rows_as_nested(bad) is None
    nts = tensordict.NonTensorStack
    assert isinstance(_merge_field(["a", "b"], nts), nts)
    assert torch.equal(_merge_field([torch.tensor(1.0), torch.tensor(2.0)], nts),
                       torch.tensor([1.0, 2.0]))
    m = _merge_field([base[0:3], other[0:5]], nts)  # a copy, as TQ makes
    assert m.is_nested and [len(r) for r in m.unbind()] == [3, 5]
