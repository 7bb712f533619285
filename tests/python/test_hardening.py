"""Inputs that run Python code or carry odd bytes at awkward moments: the
process keeps running and the error is the right one."""

import subprocess
import sys

import pytest
import torch

import dataplane


def test_exception_while_a_client_is_freed(cluster):
    """A Client freed while an exception propagates keeps the exception."""
    prog = (f"import dataplane\n"
            f"try:\n"
            f"    x = [dataplane.Client({str(cluster)!r}), 1 / 0]\n"
            f"except ZeroDivisionError:\n"
            f"    print('ok')\n"
            f"def f(c):\n"
            f"    bb = [c.alloc(100)]\n"
            f"    c.close()\n"
            f"    return (bb.pop(), 1 / 0)\n"
            f"try:\n"
            f"    f(dataplane.Client({str(cluster)!r}))\n"
            f"except ZeroDivisionError:\n"
            f"    print('ok')\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["ok", "ok"], r.stderr


class _Evil:
    """An index whose conversion empties and refills the rows list."""

    def __init__(self, rows):
        self.rows = rows

    def __index__(self):
        self.rows.clear()
        self.rows.extend(range(5000))
        return 0


def test_rows_changed_while_read(client, fresh_rows):
    r = fresh_rows(1)
    rows = [0] + list(range(1, 200))
    rows[0] = _Evil(rows)
    client.clear(rows)  # no crash; the rows read are a snapshot
    client.put(list(r), {"x": torch.zeros(1, 4)})
    assert torch.equal(client.get(list(r), ["x"])["x"][0], torch.zeros(4))


def test_detail_cut_inside_a_character(client):
    """A long detail is cut at its size limit, maybe inside a UTF-8
    character: the error is still NotFound, with the text readable."""
    for n in range(38, 46):
        with pytest.raises(dataplane.NotFound) as e:
            client.get(range(50), ["\u00e9" * n])
        assert isinstance(e.value.detail, str)


def test_odd_arguments(client):
    with pytest.raises(ValueError):
        client.get([1], ["x\0y"])
    with pytest.raises(IndexError):
        client.unit_address(2**32)
    with pytest.raises(ValueError):
        dataplane.Client(None, staging_cache_bytes=-1)
