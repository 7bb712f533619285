"""The package works with numpy alone: a fresh interpreter in which torch
cannot be imported puts and gets numpy arrays through Client and the TQ
storage client, values checked."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("numpy")

_CODE = r"""
import sys
sys.modules["torch"] = None  # import torch now fails, as where it is not installed
import numpy as np
import dataplane, dataplane.tq as dtq
c = dataplane.Client(sys.argv[1])
x = np.random.default_rng(5).standard_normal((4, 300)).astype(np.float32)
rows = [91000, 91001, 91002, 91003]
c.put(rows, {"x": x, "i": np.arange(4, dtype=np.int16)})
got = c.get(rows, ["x", "i"])
assert all(isinstance(v, np.ndarray) for v in got["x"]), [type(v) for v in got["x"]]
assert np.array_equal(np.stack(got["x"]), x) and [int(v) for v in got["i"]] == [0, 1, 2, 3]
kv = dtq.DataplaneKVClient({"cluster": sys.argv[1]})
kv.put(["91004@a", "91005@a"], [x[1], {"k": (1, 2)}])
a, b = kv.get(["91004@a", "91005@a"])
assert np.array_equal(a, x[1]) and b == {"k": [1, 2]}
c.clear(rows + [91004, 91005])
print("ok")
"""


def test_numpy_without_torch(cluster):
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", _CODE, str(cluster)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["ok"], r.stderr[-3000:]
