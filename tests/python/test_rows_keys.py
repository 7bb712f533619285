"""Row forms, bad rows, overwrite, clear, NotFound and get_keys."""

import numpy as np
import pytest
import torch

import dataplane


def _vals(rows, tag):
    return torch.tensor([[r, tag] for r in rows], dtype=torch.int64)


@pytest.mark.parametrize("form", ["list", "tuple", "range", "np_int64", "np_uint32",
                                  "np_strided", "torch_int64", "torch_int32"])
def test_row_forms(client, fresh_rows, form):
    rows = fresh_rows(8)
    lst = list(rows)
    as_form = {
        "list": lambda: lst,
        "tuple": lambda: tuple(lst),
        "range": lambda: rows,
        "np_int64": lambda: np.array(lst, dtype=np.int64),
        "np_uint32": lambda: np.array(lst, dtype=np.uint32),
        "np_strided": lambda: np.array(lst + lst, dtype=np.int64).reshape(2, 8)[0, :],
        "torch_int64": lambda: torch.tensor(lst, dtype=torch.int64),
        "torch_int32": lambda: torch.tensor(lst, dtype=torch.int32),
    }[form]
    v = _vals(lst, 1)
    client.put(as_form(), {"r": v})
    got = client.get(as_form(), ["r"])["r"]
    for i, g in enumerate(got):
        assert torch.equal(g, v[i])
    # the row forms address the same rows as plain ints
    got = client.get(lst, ["r"])["r"]
    for i, g in enumerate(got):
        assert torch.equal(g, v[i])
    assert client.clear(as_form()) == 8


def test_numpy_rows_every_int_dtype(client, fresh_rows):
    rows = fresh_rows(3)
    client.put(rows, {"d": [b"a", b"b", b"c"]})
    for dt in (np.int32, np.uint32, np.int64, np.uint64):
        assert client.get(np.array(list(rows), dtype=dt), ["d"])["d"] == [b"a", b"b", b"c"]
    # 8- and 16-bit rows: rows 5..7 are reserved for this test
    small = [5, 6, 7]
    try:
        client.put(small, {"d": [b"5", b"6", b"7"]})
        for dt in (np.int8, np.uint8, np.int16, np.uint16):
            assert client.get(np.array(small, dtype=dt), ["d"])["d"] == [b"5", b"6", b"7"]
            assert client.get(torch.tensor(small, dtype=torch.int16 if dt == np.int16
                                           else torch.uint8), ["d"])["d"] == [b"5", b"6",
                                                                               b"7"]
    finally:
        client.clear(small)


BAD_ROWS = [
    ("negative int", lambda r: [r[0], -1], ValueError),
    ("too big int", lambda r: [r[0], 2 ** 64], ValueError),
    ("negative numpy", lambda r: np.array([r[0], -1], dtype=np.int64), ValueError),
    ("negative tensor", lambda r: torch.tensor([r[0], -5]), ValueError),
    ("float tensor", lambda r: torch.tensor([float(r[0]), 1.0]), TypeError),
    ("float numpy", lambda r: np.array([float(r[0]), 1.0]), TypeError),
    ("2-D tensor", lambda r: torch.tensor([[r[0], r[1]]]), TypeError),
    ("2-D numpy", lambda r: np.array([[r[0], r[1]]], dtype=np.int64), TypeError),
    ("float in list", lambda r: [r[0], 1.5], TypeError),
    ("list in list", lambda r: [r[0], [1]], TypeError),
    ("str", lambda r: "12", TypeError),
    ("numpy bool", lambda r: np.array([True, False]), TypeError),
]


@pytest.mark.parametrize("name,make,exc", BAD_ROWS, ids=[b[0] for b in BAD_ROWS])
def test_bad_rows_refused_nothing_sent(client, fresh_rows, name, make, exc):
    rows = fresh_rows(2)
    bad = make(rows)
    with pytest.raises(exc):
        client.put(bad, {"x": [b"v0", b"v1"]})
    with pytest.raises(exc):
        client.put(bad, {"x": torch.zeros(2, 3)})
    # nothing of the refused puts landed, not even the good row
    with pytest.raises(dataplane.NotFound):
        client.get([rows[0]], ["x"])
    with pytest.raises(exc):
        client.get(bad, ["x"])
    with pytest.raises(exc):
        client.clear(bad)


def test_bool_tensor_rows_refused(client, fresh_rows):
    """A bool tensor is no list of rows (numpy bool arrays are refused too);
    it must not silently address rows 0 and 1."""
    with pytest.raises(TypeError):
        client.get(torch.tensor([True, False]), ["x"])


def test_wrong_batch_length(client, fresh_rows):
    rows = fresh_rows(3)
    with pytest.raises(ValueError, match="first dimension"):
        client.put(rows, {"x": torch.zeros(2, 4)})
    with pytest.raises(ValueError, match="2 values for 3 rows"):
        client.put(rows, {"x": [b"a", b"b"]})
    with pytest.raises(ValueError):
        client.put(rows, {"x": torch.tensor(1.0)})  # 0-d: no first dimension
    with pytest.raises(dataplane.NotFound):
        client.get(rows, ["x"])


def test_empty_rows(client):
    client.put([], {"x": torch.zeros(0, 3)})
    client.put(range(0), {"x": []})
    assert client.get([], ["x"]) == {"x": []}
    assert client.clear([]) == 0


def test_overwrite_replaces(client, fresh_rows):
    rows = fresh_rows(3)
    client.put(rows, {"o": torch.zeros(3, 4), "keep": [b"k0", b"k1", b"k2"]})
    client.put(rows, {"o": [torch.arange(2), np.arange(5, dtype=np.int8), b"now bytes"]})
    got = client.get(rows, ["o", "keep"])
    assert torch.equal(got["o"][0], torch.arange(2))
    assert isinstance(got["o"][1], np.ndarray) and got["o"][1].dtype == np.int8
    assert np.array_equal(got["o"][1], np.arange(5, dtype=np.int8))
    assert got["o"][2] == b"now bytes"
    assert got["keep"] == [b"k0", b"k1", b"k2"]  # other fields untouched
    client.put(rows[:1], {"o": torch.full((1, 1000), 3.0)})  # larger than before
    assert torch.equal(client.get(rows[:1], ["o"])["o"][0], torch.full((1000,), 3.0))


def test_clear_and_not_found(client, fresh_rows):
    rows = fresh_rows(4)
    client.put(rows, {"a": torch.ones(4, 2), "b": [b"1", b"2", None, b"4"]})
    assert client.clear([rows[0], rows[2]]) == 3  # a+b of rows[0], a of rows[2]
    assert client.clear([rows[0], rows[2]]) == 0  # already gone
    with pytest.raises(dataplane.NotFound) as ei:
        client.get([rows[0], rows[1], rows[2]], ["a", "b"])
    e = ei.value
    assert isinstance(e, KeyError) and isinstance(e, dataplane.Error)
    assert sorted(e.keys) == sorted([f"{rows[0]}@a", f"{rows[2]}@a",
                                     f"{rows[0]}@b", f"{rows[2]}@b"])
    assert e.code == dataplane._core.DP_ENOTFOUND
    assert e.name == "DP_ENOTFOUND"
    assert f"{rows[0]}@a" in str(e) and f"{rows[0]}@a" in e.detail
    with pytest.raises(KeyError):  # plain `except KeyError` catches it
        client.get_keys([f"{rows[2]}@a"])
    # the rows not cleared still hold their values
    got = client.get([rows[1], rows[3]], ["a", "b"])
    assert torch.equal(got["a"][0], torch.ones(2)) and got["b"] == [b"2", b"4"]


def test_not_found_many_keys_listed(client, fresh_rows):
    rows = fresh_rows(20)
    with pytest.raises(dataplane.NotFound) as ei:
        client.get(rows, ["m"])
    assert ei.value.keys == [f"{r}@m" for r in rows]
    assert "20 key(s)" in str(ei.value)


def test_get_keys_order(client, fresh_rows):
    rows = fresh_rows(6)
    client.put(rows, {"x": torch.arange(6).view(6, 1) * 10, "y": [bytes([i]) for i in range(6)]})
    keys = [f"{rows[5]}@x", f"{rows[0]}@y", f"{rows[2]}@x", f"{rows[0]}@x",
            f"{rows[5]}@y", f"{rows[2]}@x"]
    got = client.get_keys(keys)
    assert len(got) == len(keys)
    assert torch.equal(got[0], torch.tensor([50]))
    assert got[1] == b"\x00"
    assert torch.equal(got[2], torch.tensor([20]))
    assert torch.equal(got[3], torch.tensor([0]))
    assert got[4] == b"\x05"
    assert torch.equal(got[5], torch.tensor([20]))
    assert client.get_keys([]) == []
    with pytest.raises(dataplane.NotFound) as ei:
        client.get_keys([f"{rows[1]}@x", f"{rows[1]}@nope"])
    assert ei.value.keys == [f"{rows[1]}@nope"]


@pytest.mark.parametrize("key", ["5", "x@y", "5@", "@x", "-1@x", "1.5@x"])
def test_get_keys_malformed(client, key):
    with pytest.raises(dataplane.InvalidArgument) as ei:
        client.get_keys([key])
    assert isinstance(ei.value, ValueError)
    assert ei.value.code == dataplane._core.DP_EINVAL
    assert ei.value.name == "DP_EINVAL"
    assert key in str(ei.value)


def test_get_keys_not_str(client):
    with pytest.raises((TypeError, ValueError)):
        client.get_keys([5])
    with pytest.raises(ValueError):
        client.get_keys(["5@x\0"])


def test_get_fields_must_be_a_list(client, fresh_rows):
    with pytest.raises(TypeError):
        client.get(fresh_rows(1), "x")
