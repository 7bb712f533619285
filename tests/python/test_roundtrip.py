"""Round trips through real units: every dtype, odd shapes, both put forms,
jagged lists, None cells, non-contiguous and big-endian inputs."""

import numpy as np
import pytest
import torch

import dataplane

TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128,
]
NUMPY_DTYPES = [
    np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32,
    np.int64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
]
SHAPES = [(), (0,), (3, 0, 2), (1,), (2, 1, 3, 1, 2), (7, 5)]


def torch_values(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    if dtype == torch.bool:
        return (torch.randint(0, 2, (n,), generator=g) == 1).view(shape)
    if dtype.is_complex:
        re = torch.randn(n, generator=g, dtype=torch.float64)
        im = torch.randn(n, generator=g, dtype=torch.float64)
        return torch.complex(re, im).to(dtype).view(shape)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float32) * 100).to(dtype).view(shape)
    lo, hi = (0, 255) if dtype == torch.uint8 else (-100, 100)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype).view(shape)


def numpy_values(dtype, shape, seed):
    """An ndarray (0-d arrays too, never a numpy scalar) of that dtype and shape."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        v = rng.integers(0, 2, size=shape).astype(np.bool_)
    elif dtype.kind == "c":
        v = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    elif dtype.kind == "f":
        v = (rng.standard_normal(shape) * 100).astype(dtype)
    else:
        info = np.iinfo(dtype)
        v = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    v = np.asarray(v)
    assert v.shape == tuple(shape) and v.dtype == dtype
    return v


def assert_same_tensor(got, want):
    assert isinstance(got, torch.Tensor), type(got)
    assert got.dtype == want.dtype
    assert tuple(got.shape) == tuple(want.shape)
    assert torch.equal(got, want)


def assert_same_array(got, want):
    assert isinstance(got, np.ndarray), type(got)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_dtypes_every_shape(client, fresh_rows, dtype):
    """Every torch dtype in every odd shape, as one value per row (list form)."""
    rows = fresh_rows(len(SHAPES))
    vals = [torch_values(dtype, s, i) for i, s in enumerate(SHAPES)]
    client.put(rows, {"v": vals})
    got = client.get(rows, ["v"])["v"]
    assert len(got) == len(vals)
    for g, w in zip(got, vals):
        assert_same_tensor(g, w)


NEWER_TORCH = ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
               "float8_e5m2fnuz", "float8_e8m0fnu"]


@pytest.mark.parametrize("name", NEWER_TORCH)
def test_newer_torch_dtypes(client, fresh_rows, name):
    """torch 2.x's unsigned and float8 dtypes (where this torch has them),
    both put forms; compared byte for byte (torch.equal has no float8)."""
    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip(f"this torch ({torch.__version__}) has no {name}")
    rows = fresh_rows(len(SHAPES) + 3)
    src = torch.randint(0, 100, (3, 4, 5)) if "uint" in name else torch.randn(3, 4, 5) * 8
    batch = src.to(dtype)
    vals = [torch.randint(0, 100, s).to(dtype) if "uint" in name else
            (torch.randn(s) * 8).to(dtype) for s in SHAPES]
    client.put(rows[:len(SHAPES)], {"v": vals})
    client.put(rows[len(SHAPES):], {"v": batch})
    got = client.get(rows, ["v"])["v"]
    for g, w in zip(got, vals + list(batch)):
        assert g.dtype == dtype and g.shape == w.shape
        assert torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_dtypes_every_shape(client, fresh_rows, dtype):
    rows = fresh_rows(len(SHAPES))
    vals = [numpy_values(dtype, s, i) for i, s in enumerate(SHAPES)]
    client.put(rows, {"v": vals})
    got = client.get(rows, ["v"])["v"]
    for g, w in zip(got, vals):
        assert_same_array(g, w)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_batch_form(client, fresh_rows, dtype):
    """A batch tensor whose first dim is len(rows): row i gets batch[i]."""
    rows = fresh_rows(4)
    batch = torch_values(dtype, (4, 3, 5), 7)
    client.put(rows, {"b": batch})
    got = client.get(rows, ["b"])["b"]
    for i, g in enumerate(got):
        assert_same_tensor(g, batch[i])


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_batch_form(client, fresh_rows, dtype):
    rows = fresh_rows(3)
    batch = numpy_values(dtype, (3, 2, 4), 11)
    client.put(rows, {"b": batch})
    got = client.get(rows, ["b"])["b"]
    for i, g in enumerate(got):
        assert_same_array(g, batch[i])


def test_batch_odd_row_shapes(client, fresh_rows):
    """Batches whose rows are 0-d, empty and 5-D."""
    rows = fresh_rows(3)
    data = {
        "scalar": torch.arange(3, dtype=torch.int64),          # rows of shape ()
        "empty": torch.zeros(3, 0, 2),                          # rows of shape (0, 2)
        "five": torch_values(torch.float32, (3, 2, 1, 2, 3, 2), 1),  # 5-D rows
        "np0": np.arange(3, dtype=np.uint64),
        "npempty": np.zeros((3, 0), dtype=np.int16),
    }
    client.put(rows, data)
    got = client.get(rows, list(data))
    for i in range(3):
        assert_same_tensor(got["scalar"][i], data["scalar"][i])
        assert got["scalar"][i].dim() == 0
        assert_same_tensor(got["empty"][i], data["empty"][i])
        assert_same_tensor(got["five"][i], data["five"][i])
        assert_same_array(got["np0"][i], data["np0"][i])
        assert got["np0"][i].shape == ()
        assert_same_array(got["npempty"][i], data["npempty"][i])


def test_large_values(client, fresh_rows):
    """1 MiB values, in both put forms."""
    rows = fresh_rows(4)
    big = torch_values(torch.float32, (2, 256 * 1024), 3)  # 1 MiB per row
    arr = numpy_values(np.uint8, (2, 1 << 20), 4)
    client.put(rows[:2], {"t": big})
    client.put(rows[2:], {"t": [arr[0], arr[1]]})
    got = client.get(rows, ["t"])["t"]
    assert_same_tensor(got[0], big[0])
    assert_same_tensor(got[1], big[1])
    assert_same_array(got[2], arr[0])
    assert_same_array(got[3], arr[1])


def test_bytes_round_trip(client, fresh_rows):
    rows = fresh_rows(4)
    vals = [b"hello", b"", bytes(range(256)) * 300, bytearray(b"mutable")]
    client.put(rows, {"raw": vals})
    got = client.get(rows, ["raw"])["raw"]
    for g, w in zip(got, vals):
        assert type(g) is bytes
        assert g == bytes(w)


def test_memoryview_cell_is_bytes(client, fresh_rows):
    rows = fresh_rows(1)
    client.put(rows, {"m": [memoryview(b"abcdef")[1:4]]})
    assert client.get(rows, ["m"])["m"] == [b"bcd"]


def test_several_fields_and_kinds_in_one_put(client, fresh_rows):
    rows = fresh_rows(2)
    t = torch_values(torch.int32, (2, 4), 5)
    a = numpy_values(np.float64, (2, 3), 6)
    client.put(rows, {"t": t, "a": a, "b": [b"x", b"yy"]})
    got = client.get(rows, ["b", "a", "t"])
    assert list(got) == ["b", "a", "t"]
    assert got["b"] == [b"x", b"yy"]
    for i in range(2):
        assert_same_tensor(got["t"][i], t[i])
        assert_same_array(got["a"][i], a[i])


def test_jagged_list(client, fresh_rows):
    """One value per row, each with its own shape and even its own dtype."""
    rows = fresh_rows(5)
    vals = [
        torch.arange(3, dtype=torch.float32),
        torch.arange(12, dtype=torch.float32).view(3, 4),
        torch.zeros(0, dtype=torch.float32),
        torch.tensor(7, dtype=torch.int16),
        np.arange(10, dtype=np.int32).reshape(2, 5),
    ]
    client.put(rows, {"j": vals})
    got = client.get(rows, ["j"])["j"]
    for g, w in zip(got[:4], vals[:4]):
        assert_same_tensor(g, w)
    assert_same_array(got[4], vals[4])


def test_jagged_runs_come_back_as_views_of_one_tensor(client, fresh_rows):
    """1-D values of one dtype and any lengths (token ids, log probabilities)
    are made with one split per run of the fetched memory: every value equal,
    of its own dtype and length, the run's values sharing one storage; a value
    of another kind or shape in between ends a run, and lengths whose 64-byte
    rounding leaves gaps of odd element counts come back right."""
    n = 40
    rows = fresh_rows(n)
    g = torch.Generator().manual_seed(5)
    lens = [int(x) for x in torch.randint(1, 300, (n,), generator=g)]
    ids = [torch.randint(0, 1 << 40, (k,), generator=g) for k in lens]
    lp = [torch.randn(k, generator=g) for k in lens]
    u8 = [torch.randint(0, 255, (k + 1,), generator=g, dtype=torch.uint8) for k in lens]
    mixed = [torch.arange(k, dtype=torch.int16) for k in lens]
    mixed[7] = torch.arange(6, dtype=torch.int16).view(2, 3)  # 2-D: ends a run
    mixed[20] = b"bytes"                                        # not a tensor
    mixed[30] = torch.arange(5, dtype=torch.int32)             # another dtype
    client.put(rows, {"ids": ids, "lp": lp, "u8": u8, "mixed": mixed})
    got = client.get(rows, ["ids", "lp", "u8", "mixed"])
    for f, want in (("ids", ids), ("lp", lp), ("u8", u8)):
        for a, b in zip(got[f], want):
            assert_same_tensor(a, b)
        stores = {t.untyped_storage().data_ptr() for t in got[f]}
        assert len(stores) < n, f  # runs: far fewer storages than values
    for i, (a, b) in enumerate(zip(got["mixed"], mixed)):
        if isinstance(b, bytes):
            assert a == b
        else:
            assert_same_tensor(a, b)
    # each value is its own: writing one leaves its neighbours alone
    got["ids"][0].fill_(-1)
    assert_same_tensor(got["ids"][1], ids[1])
    assert_same_tensor(client.get(rows[:1], ["ids"])["ids"][0], ids[0])


def test_numpy_scalar_cell(client, fresh_rows):
    rows = fresh_rows(2)
    client.put(rows, {"s": [np.float32(2.5), np.int64(-3)]})
    got = client.get(rows, ["s"])["s"]
    assert_same_array(got[0], np.array(2.5, dtype=np.float32))
    assert_same_array(got[1], np.array(-3, dtype=np.int64))


def test_none_cells_are_skipped(client, fresh_rows):
    rows = fresh_rows(3)
    old = torch.tensor([1.0, 2.0])
    client.put([rows[1]], {"f": [old]})
    new = [torch.tensor([5.0]), None, None]
    client.put(rows, {"f": new, "g": [None, b"g1", None]})
    got = client.get([rows[0], rows[1]], ["f"])["f"]
    assert_same_tensor(got[0], new[0])
    assert_same_tensor(got[1], old)  # the None left the old value in place
    assert client.get([rows[1]], ["g"])["g"] == [b"g1"]
    with pytest.raises(dataplane.NotFound) as ei:
        client.get([rows[2]], ["f"])  # never put: the None stored nothing
    assert ei.value.keys == [f"{rows[2]}@f"]
    with pytest.raises(dataplane.NotFound) as ei:
        client.get([rows[0], rows[2]], ["g"])
    assert sorted(ei.value.keys) == sorted([f"{rows[0]}@g", f"{rows[2]}@g"])


def test_non_contiguous_torch(client, fresh_rows):
    rows = fresh_rows(6)
    base = torch_values(torch.float32, (4, 6), 8)
    transposed = base.t()                    # (6, 4), not contiguous
    stepped = torch_values(torch.int64, (8, 10), 9)[::2, ::3]  # (4, 4)
    assert not transposed.is_contiguous() and not stepped.is_contiguous()
    before = client.counters()["copied_bytes"]
    client.put(rows, {"tr": transposed})
    mid = client.counters()["copied_bytes"]
    assert mid - before >= transposed.numel() * transposed.element_size()
    client.put(rows[:4], {"st": [stepped[i] for i in range(4)]})  # strided rows
    client.put(rows[4:], {"col": [base[:, 1], base[:, 2]]})        # columns
    assert client.counters()["copied_bytes"] > mid
    got = client.get(rows, ["tr"])["tr"]
    for i in range(6):
        assert_same_tensor(got[i], transposed[i])
        assert got[i].is_contiguous()
    got = client.get(rows[:4], ["st"])["st"]
    for i in range(4):
        assert_same_tensor(got[i], stepped[i])
    got = client.get(rows[4:], ["col"])["col"]
    assert_same_tensor(got[0], base[:, 1])
    assert_same_tensor(got[1], base[:, 2])


def test_non_contiguous_numpy(client, fresh_rows):
    rows = fresh_rows(5)
    base = numpy_values(np.int32, (5, 7), 10)
    fortran = np.asfortranarray(base)
    stepped = numpy_values(np.float64, (10, 9), 12)[::2, ::4]  # (5, 3)
    assert not fortran.flags.c_contiguous and not stepped.flags.c_contiguous
    before = client.counters()["copied_bytes"]
    client.put(rows, {"f": fortran, "s": [stepped[i] for i in range(5)]})
    assert client.counters()["copied_bytes"] - before >= fortran.nbytes
    got = client.get(rows, ["f", "s"])
    for i in range(5):
        assert_same_array(got["f"][i], base[i])
        assert_same_array(got["s"][i], stepped[i])


def test_contiguous_put_copies_nothing(client, fresh_rows):
    rows = fresh_rows(2)
    before = client.counters()["copied_bytes"]
    client.put(rows, {"c": torch.ones(2, 100), "n": [np.ones(3), b"x"]})
    assert client.counters()["copied_bytes"] == before


@pytest.mark.parametrize("code", [">i4", ">f8", ">u2", ">c8"])
def test_big_endian_numpy(client, fresh_rows, code):
    rows = fresh_rows(3)
    native = numpy_values(np.dtype(code).newbyteorder("="), (3, 4), 13)
    be = native.astype(code)
    assert be.dtype.byteorder == ">"
    client.put(rows[:2], {"be": be[:2]})          # batch form
    client.put(rows[2:], {"be": [be[2]]})         # list form
    got = client.get(rows, ["be"])["be"]
    for i in range(3):
        assert got[i].dtype == native.dtype       # back in native byte order
        assert got[i].dtype.isnative
        assert_same_array(got[i], native[i])


def test_values_are_writable_copies_of_the_store(client, fresh_rows):
    """A got value is the caller's: changing it changes nothing stored."""
    rows = fresh_rows(1)
    client.put(rows, {"w": torch.arange(4).view(1, 4)})
    g = client.get(rows, ["w"])["w"][0]
    g += 10
    assert_same_tensor(client.get(rows, ["w"])["w"][0], torch.arange(4))


def test_get_into_out(client, fresh_rows):
    """get(out=...) receives into the caller's tensors and arrays (batch and
    per-row destinations); the values returned are views of them."""
    rows = fresh_rows(3)
    t = torch_values(torch.float32, (3, 2, 5), 14)
    a = numpy_values(np.int16, (3, 6), 15)
    client.put(rows, {"t": t, "a": a})
    out_t = torch.zeros(3, 2, 5)
    out_a = [np.zeros(6, dtype=np.int16) for _ in range(3)]
    got = client.get(rows, ["t", "a"], out={"t": out_t, "a": out_a})
    assert torch.equal(out_t, t)
    for i in range(3):
        assert_same_tensor(got["t"][i], t[i])
        assert got["t"][i].data_ptr() == out_t[i].data_ptr()
        assert np.array_equal(out_a[i], a[i])
        assert np.shares_memory(got["a"][i], out_a[i])


def test_get_into_larger_out_gives_value_shape(client, fresh_rows):
    rows = fresh_rows(1)
    v = torch.arange(6, dtype=torch.int32).view(2, 3)
    client.put(rows, {"v": [v]})
    out = torch.full((10,), -1, dtype=torch.int32)
    got = client.get(rows, ["v"], out={"v": [out]})["v"][0]
    assert_same_tensor(got, v)
    assert torch.equal(out[6:], torch.full((4,), -1, dtype=torch.int32))


def test_get_into_wrong_dtype_raises(client, fresh_rows):
    rows = fresh_rows(1)
    client.put(rows, {"v": [torch.arange(4, dtype=torch.float32)]})
    with pytest.raises(TypeError):
        client.get(rows, ["v"], out={"v": [torch.zeros(4, dtype=torch.int32)]})


def test_get_into_too_small_out(client, fresh_rows):
    rows = fresh_rows(1)
    client.put(rows, {"v": [torch.arange(4, dtype=torch.float32)]})
    with pytest.raises(dataplane.TooBig) as ei:
        client.get(rows, ["v"], out={"v": [torch.zeros(2)]})
    assert ei.value.keys == [f"{rows[0]}@v"]


def test_get_into_numpy_out_of_another_dtype_raises(client, fresh_rows):
    """As for a torch destination: an array of another dtype (or of the other
    byte order) must be refused, not filled with reinterpreted bytes."""
    rows = fresh_rows(1)
    client.put(rows, {"v": [np.arange(4, dtype=np.float32)]})
    with pytest.raises(TypeError):
        client.get(rows, ["v"], out={"v": [np.zeros(4, dtype=np.int32)]})
    with pytest.raises((TypeError, ValueError)):
        got = client.get(rows, ["v"], out={"v": [np.zeros(4, dtype=">f4")]})["v"][0]
        # accepting it is fine only if the values come out right
        assert np.array_equal(got, np.arange(4, dtype=np.float32))
        raise ValueError("accepted with the right values")


def test_duplicate_rows_in_one_get(client, fresh_rows):
    rows = fresh_rows(2)
    client.put(rows, {"d": torch.arange(4).view(2, 2)})
    got = client.get([rows[1], rows[0], rows[1]], ["d"])["d"]
    assert torch.equal(got[0], torch.tensor([2, 3]))
    assert torch.equal(got[1], torch.tensor([0, 1]))
    assert torch.equal(got[2], torch.tensor([2, 3]))


def test_requires_grad_tensors(client, fresh_rows):
    rows = fresh_rows(2)
    g = torch.randn(2, 3, requires_grad=True)
    gt = torch.randn(3, 2, requires_grad=True).t()  # non-contiguous: copied
    client.put(rows, {"g": g, "gt": gt})
    got = client.get(rows, ["g", "gt"])
    for i in range(2):
        assert_same_tensor(got["g"][i], g[i].detach())
        assert_same_tensor(got["gt"][i], gt[i].detach())


def test_conjugate_and_negative_views(client, fresh_rows):
    """t.conj() (and torch's negative views) are lazy: the memory holds the
    unconjugated values and a bit says how to read them. A put must store the
    values the tensor has, not its raw memory."""
    rows = fresh_rows(2)
    t = torch.tensor([[1 + 2j, 3 - 4j], [-5 + 0.5j, 0 - 1j]], dtype=torch.complex64)
    cj = t.conj()
    assert cj.is_conj()
    client.put(rows, {"batch": cj, "cells": [cj[0], cj[1]]})
    got = client.get(rows, ["batch", "cells"])
    for i in range(2):
        want = cj[i].resolve_conj()
        assert_same_tensor(got["batch"][i], want)
        assert_same_tensor(got["cells"][i], want)
    neg = torch._neg_view(torch.tensor([[1.0, -2.0]]))
    assert neg.is_neg()
    client.put(rows[:1], {"neg": neg})
    assert_same_tensor(client.get(rows[:1], ["neg"])["neg"][0], torch.tensor([-1.0, 2.0]))


def test_lazy_zero_tensors(client, fresh_rows):
    """torch's lazy zeros (_efficientzerotensor, made by autograd) have no
    memory (data pointer 0): a put copies their zeros; as a get's destination
    they are refused with what to pass instead."""
    rows = fresh_rows(2)
    z = torch._efficientzerotensor(3, 3)
    assert z.data_ptr() == 0 and z[1:].data_ptr() == 12  # slices: their offset
    client.put(rows, {"batch": z[1:], "cells": [z[2], torch.ones(2)]})
    got = client.get(rows, ["batch", "cells"])
    for i in range(2):
        assert_same_tensor(got["batch"][i], torch.zeros(3))
    assert_same_tensor(got["cells"][0], torch.zeros(3))
    assert_same_tensor(got["cells"][1], torch.ones(2))
    for o in (z[1:], z[:2]):
        with pytest.raises(ValueError, match="no memory to write"):
            client.get(rows, ["batch"], out={"batch": o})
    with pytest.raises(ValueError, match="no memory"):
        client.register(z[1:])
