"""Error classes, their attributes, connection failures and bad arguments."""

import os
import socket
import time

import numpy as np
import pytest
import torch

import dataplane
from dataplane import _core

ERROR_CLASSES = {
    "InvalidArgument": ("DP_EINVAL", ValueError),
    "OutOfMemory": ("DP_ENOMEM", MemoryError),
    "Timeout": ("DP_ETIMEDOUT", TimeoutError),
    "UnitFull": ("DP_EUNITFULL", None),
    "Busy": ("DP_EBUSY", None),
    "Lost": ("DP_ELOST", None),
    "ProtocolError": ("DP_EPROTO", None),
    "TransferError": ("DP_ETRANSFER", ConnectionError),
    "Fatal": ("DP_EFATAL", None),
    "PolicyError": ("DP_EPOLICY", None),
    "Closed": ("DP_ECLOSED", None),
    "SysError": ("DP_ESYS", OSError),
    "TooBig": ("DP_ETOOBIG", ValueError),
    "NotFound": ("DP_ENOTFOUND", KeyError),
    "Exists": ("DP_EEXIST", None),
    "Corrupt": ("DP_ECORRUPT", None),
    "Unsupported": ("DP_EUNSUPPORTED", NotImplementedError),
    "Canceled": ("DP_ECANCELED", None),
    "Restarted": ("DP_ERESTARTED", None),
}


def test_error_hierarchy():
    assert issubclass(dataplane.Error, Exception)
    for name, (code_name, builtin) in ERROR_CLASSES.items():
        cls = getattr(dataplane, name)
        assert issubclass(cls, dataplane.Error), name
        if builtin is not None:
            assert issubclass(cls, builtin), name
        assert isinstance(getattr(_core, code_name), int)
    assert issubclass(dataplane.InvalidArgument, ValueError)
    assert issubclass(dataplane.NotFound, KeyError)
    assert issubclass(dataplane.Timeout, TimeoutError)
    # distinct classes, one per code
    assert len({getattr(dataplane, n) for n in ERROR_CLASSES}) == len(ERROR_CLASSES)


def test_every_code_maps_to_its_class():
    from dataplane.client import make_error
    for name, (code_name, _) in ERROR_CLASSES.items():
        code = getattr(_core, code_name)
        e = make_error(code, f"detail of {name}")
        assert type(e) is getattr(dataplane, name)
        assert e.code == code and e.name == code_name and e.detail == f"detail of {name}"
        assert _core.strerror(code)


def test_error_attributes_from_a_real_call(client):
    with pytest.raises(dataplane.InvalidArgument) as ei:
        client.get_keys(["nope"])
    e = ei.value
    assert e.code == _core.DP_EINVAL and e.name == "DP_EINVAL"
    assert isinstance(e.detail, str) and "nope" in e.detail
    assert e.keys is None and e.rows is None and e.landed is None


def test_no_cluster_file(tmp_path):
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    t0 = time.monotonic()
    with pytest.raises(dataplane.NotFound) as ei:
        dataplane.Client(empty, timeout_s=5, connect_timeout_s=5)
    assert time.monotonic() - t0 < 3
    msg = str(ei.value)
    assert str(empty) in msg and "dataplane up" in msg
    assert ei.value.code == _core.DP_ENOTFOUND
    with pytest.raises(dataplane.NotFound):
        dataplane.Client(str(tmp_path / "missing" / "cluster.json"))


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_unit():
    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises((dataplane.Timeout, dataplane.TransferError)) as ei:
        dataplane.Client([f"tcp://127.0.0.1:{port}"], connect_timeout_s=2, timeout_s=2)
    assert time.monotonic() - t0 < 8
    assert isinstance(ei.value, dataplane.Error)
    assert str(port) in str(ei.value)


def test_client_option_checks(cluster):
    for bad in (0, -1, "5", None, 1e9):
        with pytest.raises(ValueError):
            dataplane.Client(cluster, timeout_s=bad)
        with pytest.raises(ValueError):
            dataplane.Client(cluster, connect_timeout_s=bad)
    with pytest.raises((TypeError, ValueError)):
        dataplane.Client([])
    with pytest.raises(TypeError):
        dataplane.Client([5])


def test_client_accepts_paths(cluster):
    for where in (cluster, str(cluster), cluster / "cluster.json"):
        with dataplane.Client(where, timeout_s=20) as c:
            assert c.n_units == 2
            assert c.unit_address(0).startswith("tcp://")
            with pytest.raises(IndexError):
                c.unit_address(2)


def test_client_from_addresses(client, fresh_rows):
    addrs = [client.unit_address(i) for i in range(client.n_units)]
    rows = fresh_rows(4)
    client.put(rows, {"a": torch.arange(8).view(4, 2)})
    with dataplane.Client(addrs, timeout_s=20) as c2:
        got = c2.get(rows, ["a"])["a"]
    for i, g in enumerate(got):
        assert torch.equal(g, torch.arange(8).view(4, 2)[i])


def test_cluster_from_environment(cluster, monkeypatch):
    monkeypatch.setenv("DP_CLUSTER", str(cluster / "cluster.json"))
    with dataplane.Client(timeout_s=20) as c:
        assert c.n_units == 2


def test_bad_field_name_type(client, fresh_rows):
    rows = fresh_rows(1)
    with pytest.raises(TypeError) as ei:
        client.put(rows, {1: torch.zeros(1, 2)})
    assert "1" in str(ei.value)
    with pytest.raises(TypeError):
        client.get(rows, [1])
    with pytest.raises(ValueError):
        client.put(rows, {"a\0b": [b"x"]})


def test_unsupported_values_name_the_field(client, fresh_rows):
    rows = fresh_rows(2)
    with pytest.raises(TypeError) as ei:
        client.put(rows, {"fld": [b"ok", {"a": 1}]})
    assert "'fld'" in str(ei.value) and "dict" in str(ei.value)
    with pytest.raises(TypeError) as ei:
        client.put(rows, {"col": {"a": 1}})
    assert "'col'" in str(ei.value)
    with pytest.raises(TypeError) as ei:
        client.put(rows, {"s": ["a str", b"x"]})
    assert "'s'" in str(ei.value)
    with pytest.raises(TypeError) as ei:
        client.put(rows, {"u": np.array([b"ab", b"cd"])})  # no stored dtype
    with pytest.raises(TypeError):
        client.put(rows, [("x", b"y")])  # data: not a dict
    # nothing landed from any of them
    with pytest.raises(dataplane.NotFound):
        client.get(rows, ["fld"])


def test_too_many_dims(client, fresh_rows):
    rows = fresh_rows(1)
    t = torch.zeros([1] * (_core.SHAPE_MAX + 1))
    with pytest.raises(ValueError):
        client.put(rows, {"d": [t]})
    ok = torch.arange(2).view([1] * (_core.SHAPE_MAX - 1) + [2])
    client.put(rows, {"d": [ok]})
    got = client.get(rows, ["d"])["d"][0]
    assert got.shape == ok.shape and torch.equal(got, ok)


def test_version():
    v = dataplane.version()
    assert isinstance(v, str) and v.count(".") >= 2
    assert dataplane.__version__ == v
    assert os.path.basename(dataplane._core.__file__).startswith("_core")
