"""Small values travel inside the control messages (docs/design.md, "Inline
values"): a unit's small blob goes in its put request, and a get's values
come in the units' replies, byte for byte, as the types they were put as."""

import numpy as np
import pytest
import torch

import dataplane


def _sum(c, name):
    return sum(s[name] for s in c.stats())


def test_small_put_and_get_go_inline(cluster, fresh_rows):
    rows = fresh_rows(4)
    with dataplane.Client(cluster, timeout_s=20) as c:
        n_units = len(c.stats())
        p0, b0 = _sum(c, "puts_inline"), _sum(c, "inline_bytes")
        t = torch.arange(4 * 100, dtype=torch.float32).view(4, 100)
        a = [np.full(7 + i, i, dtype=np.int16) for i in range(4)]
        b = [b"x" * i for i in range(4)]
        c.put(rows, {"t": t, "a": a, "b": b})
        # one put request per unit that got rows, nothing else
        assert _sum(c, "puts_inline") - p0 == len({r % n_units for r in rows})
        got = c.get(rows, ["t", "a", "b"])
        for i in range(4):
            assert torch.equal(got["t"][i], t[i])
            assert got["a"][i].dtype == np.int16 and np.array_equal(got["a"][i], a[i])
            assert got["b"][i] == b[i]
        want = t.numel() * 4 + sum(x.nbytes for x in a) + sum(len(x) for x in b)
        assert _sum(c, "inline_bytes") - b0 == want
        # into caller tensors as well
        out = torch.zeros(4, 100)
        c.get(rows, ["t"], out={"t": out})
        assert torch.equal(out, t)
        assert _sum(c, "pins") == 0


def test_inline_off_and_bad_settings(cluster, fresh_rows):
    rows = fresh_rows(2)
    with dataplane.Client(cluster, timeout_s=20, inline_bytes=0) as c:
        p0, b0 = _sum(c, "puts_inline"), _sum(c, "inline_bytes")
        t = torch.randn(2, 16)
        c.put(rows, {"t": t})
        assert torch.equal(torch.stack(c.get(rows, ["t"])["t"]), t)
        assert _sum(c, "puts_inline") == p0 and _sum(c, "inline_bytes") == b0
    for bad in (-1, (1 << 20) + 1, 1.5, True, "32K"):
        with pytest.raises(ValueError, match="inline_bytes"):
            dataplane.Client(cluster, inline_bytes=bad)


def test_a_unit_bound_blob_larger_than_inline_goes_by_write(cluster, fresh_rows):
    rows = fresh_rows(1)
    with dataplane.Client(cluster, timeout_s=20, inline_bytes=4096) as c:
        p0 = _sum(c, "puts_inline")
        big = np.arange(2048, dtype=np.int32)  # 8 KiB: over 4 KiB
        c.put(rows, {"v": [big]})
        assert _sum(c, "puts_inline") == p0
        assert np.array_equal(c.get(rows, ["v"])["v"][0], big)
