"""get(..., stack=True): one tensor or array per field instead of a list of
rows; from the fetched memory (a view when the rows lie back to back there,
else gathered) or into the caller's batch destination."""

import numpy as np
import pytest
import torch

import dataplane


def test_stack_gathers_rows_of_both_units(client, fresh_rows):
    rows = list(fresh_rows(300))  # consecutive rows: they alternate between the units
    g = torch.Generator().manual_seed(3)
    data = {
        "t": torch.randn(300, 5, 3, generator=g),
        "ids": torch.randint(0, 1 << 40, (300, 17), generator=g),
        "r": torch.randn(300, generator=g),  # 0-d rows
        "a": np.arange(300 * 6, dtype=np.float64).reshape(300, 6),
    }
    client.put(rows, data)
    got = client.get(rows, list(data), stack=True)
    for f in ("t", "ids", "r"):
        assert isinstance(got[f], torch.Tensor)
        assert got[f].dtype == data[f].dtype
        assert torch.equal(got[f], data[f]), f
    assert isinstance(got["a"], np.ndarray) and got["a"].dtype == np.float64
    assert np.array_equal(got["a"], data["a"])
    # a row tensor taken from the list form is the same as the stacked row
    lst = client.get(rows, ["t"])["t"]
    assert all(torch.equal(lst[i], got["t"][i]) for i in range(0, 300, 37))


def test_stack_is_a_view_when_one_unit_holds_the_rows_in_order(client, fresh_rows):
    base = fresh_rows(400).start  # rows base, base + 2, ...: all on one unit
    rows = list(range(base, base + 400, 2))
    x = torch.arange(200 * 64, dtype=torch.float32).view(200, 64)
    client.put(rows, {"x": x})
    got = client.get(rows, ["x"], stack=True)["x"]
    assert torch.equal(got, x)
    assert got._base is not None  # a view of the fetched values, not a copy
    del got  # the fetched memory lives while a view does; gone now


def test_stack_of_both_units_rows_is_a_view_when_rows_are_64_byte_multiples(client,
                                                                            fresh_rows):
    """The library lays a get's values out in the keys' order, each at a
    multiple of 64 bytes: rows that alternate between units still lie back to
    back, so a field of 64-byte-multiple rows is one view, nothing copied;
    other row sizes are gathered into one contiguous tensor (counted)."""
    rows = list(fresh_rows(256))  # consecutive: they alternate between the units
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 32, generator=g)  # 128-byte rows
    y = torch.randn(256, 3, generator=g)  # 12-byte rows: padded to 64 when fetched
    a = np.arange(256 * 8, dtype=np.int64).reshape(256, 8)  # 64-byte rows
    client.put(rows, {"x": x, "y": y, "a": a})
    c0 = client.counters()["copied_bytes"]
    got = client.get(rows, ["x", "a"], stack=True)
    assert torch.equal(got["x"], x) and got["x"].is_contiguous()
    assert np.array_equal(got["a"], a) and got["a"].flags.c_contiguous
    assert client.counters()["copied_bytes"] == c0  # views of the fetched memory
    yy = client.get(rows, ["y"], stack=True)["y"]
    assert torch.equal(yy, y) and yy.is_contiguous()
    assert client.counters()["copied_bytes"] == c0 + y.numel() * 4
    # in another order than the rows were put, still one view of the keys' order
    rev = rows[::-1]
    got = client.get(rev, ["x"], stack=True)["x"]
    assert torch.equal(got, x.flip(0))
    assert client.counters()["copied_bytes"] == c0 + y.numel() * 4


def test_stack_refuses_values_that_do_not_stack(client, fresh_rows):
    rows = list(fresh_rows(4))
    client.put(rows, {"j": [torch.zeros(3), torch.zeros(3), torch.zeros(4), torch.zeros(3)],
                      "d": [torch.zeros(2), torch.zeros(2, dtype=torch.float64),
                            torch.zeros(2), torch.zeros(2)],
                      "b": [b"ab", b"cd", b"ef", b"gh"]})
    with pytest.raises(ValueError, match=rf"{rows[2]}@j"):
        client.get(rows, ["j"], stack=True)
    with pytest.raises(ValueError, match=rf"{rows[1]}@d"):
        client.get(rows, ["d"], stack=True)
    with pytest.raises(ValueError, match="tensors or arrays"):
        client.get(rows, ["b"], stack=True)
    with pytest.raises(ValueError, match="at least one row"):
        client.get([], ["j"], stack=True)
    # missing keys are NotFound, as without stack
    with pytest.raises(dataplane.NotFound):
        client.get(rows + [rows[-1] + 9], ["j"], stack=True)


def test_stack_into_out_returns_the_destination(client, fresh_rows):
    rows = list(fresh_rows(128))
    src = torch.randn(128, 33)
    client.put(rows, {"s": src})
    out = torch.empty(128, 33)
    got = client.get(rows, ["s"], out={"s": out}, stack=True)["s"]
    assert got is out
    assert torch.equal(out, src)
    arr = np.empty((128, 33), dtype=np.float32)
    got = client.get(rows, ["s"], out={"s": arr}, stack=True)["s"]
    assert got is arr and np.array_equal(arr, src.numpy())
    # the list form of out= still gives views of the rows
    views = client.get(rows, ["s"], out={"s": out})["s"]
    assert len(views) == 128 and views[5].data_ptr() == out[5].data_ptr()
    with pytest.raises(ValueError, match="not a list"):
        client.get(rows, ["s"], out={"s": [out[i] for i in range(128)]}, stack=True)
    with pytest.raises(TypeError, match="float64"):
        client.get(rows, ["s"], out={"s": torch.empty(128, 33, dtype=torch.float64)},
                   stack=True)
    # no rows: the (empty) destination itself
    empty = torch.empty(0, 33)
    assert client.get([], ["s"], out={"s": empty}, stack=True)["s"] is empty
    # values shorter than the rows of out: landed, but they do not make a batch
    client.put(rows[:2], {"s": torch.randn(2, 30)})
    with pytest.raises(ValueError, match=r"float32\(30,\)"):
        client.get(rows, ["s"], out={"s": out}, stack=True)


def test_out_rows_of_mixed_sizes_still_fit(client, fresh_rows):
    """The compact answer of get_into_rows: a field whose values differ comes
    back value by value (each fitted to its destination)."""
    rows = list(fresh_rows(3))
    client.put(rows, {"m": [torch.ones(4), torch.ones(2) * 2, torch.ones(4) * 3]})
    out = torch.zeros(3, 4)
    got = client.get(rows, ["m"], out={"m": out})["m"]
    assert [tuple(v.shape) for v in got] == [(4,), (2,), (4,)]
    assert torch.equal(got[1], torch.full((2,), 2.0))
    assert torch.equal(out[2], torch.full((4,), 3.0))


def test_values_in_any_order_come_back_right(client, fresh_rows):
    """Values.runs finds chains of equal tensors in the fetched memory at a
    constant step of index; keys in a shuffled order, fields of mixed
    dtypes, shapes and kinds still come back each as its own value."""
    import random
    rows = list(fresh_rows(64))
    g = torch.Generator().manual_seed(9)
    data = {
        "a": torch.randn(64, 8, generator=g),
        "b": [torch.randint(0, 9, (k % 5 + 1,), generator=g) for k in range(64)],
        "c": [b"x" * k if k % 3 else torch.full((2,), float(k)) for k in range(64)],
        "d": np.arange(64 * 3, dtype=np.int16).reshape(64, 3),
    }
    client.put(rows, data)
    keys = [f"{r}@{f}" for f in data for r in rows]
    rnd = random.Random(5)
    for order in ("sorted", "reversed", "shuffled", "by row"):
        ks = list(keys)
        if order == "reversed":
            ks.reverse()
        elif order == "shuffled":
            rnd.shuffle(ks)
        elif order == "by row":
            ks = [f"{r}@{f}" for r in rows for f in data]
        got = client.get_keys(ks)
        for k, v in zip(ks, got):
            r, f = k.split("@")
            want = data[f][rows.index(int(r))]
            if isinstance(want, bytes):
                assert v == want, (order, k)
            elif isinstance(want, np.ndarray):
                assert isinstance(v, np.ndarray) and np.array_equal(v, want), (order, k)
            else:
                assert isinstance(v, torch.Tensor) and torch.equal(v, want), (order, k)
