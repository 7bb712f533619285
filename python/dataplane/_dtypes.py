"""Stored dtype names and the torch and numpy types they stand for.

A tensor's dtype travels as a short name (docs/design.md, "Python package"):
torch tensors under torch's names ("float32", "bfloat16", "int64"...), the
names C programs use too; numpy arrays under "np_" plus numpy's name
("np_float32"), so a get gives back the kind of array that was put.
"""

try:
    import numpy as np
except ImportError:  # the package works with torch alone, or with bytes alone
    np = None

try:
    import torch
except ImportError:
    torch = None

_TORCH_NAMES = [  # those this torch has (the unsigned and float8 ones since torch 2.x)
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
    "float32", "float64", "complex64", "complex128", "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
]
_NUMPY_NAMES = [
    "bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32",
    "int64", "float16", "float32", "float64", "complex64", "complex128",
]

TORCH_TO_NAME = {}
NAME_TO_TORCH = {}
if torch is not None:
    for _n in _TORCH_NAMES:
        _t = getattr(torch, _n, None)
        if _t is not None:
            TORCH_TO_NAME[_t] = _n
            NAME_TO_TORCH[_n] = _t
    if hasattr(torch, "complex32"):
        TORCH_TO_NAME[torch.complex32] = "complex32"
        NAME_TO_TORCH["complex32"] = torch.complex32

NUMPY_TO_NAME = {}
NAME_TO_NUMPY = {}
if np is not None:
    for _n in _NUMPY_NAMES:
        _d = np.dtype(_n)
        NUMPY_TO_NAME[_d] = "np_" + _n
        NAME_TO_NUMPY["np_" + _n] = _d

# Element sizes of every stored name (validation of what comes back).
ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "float16": 2,
    "bfloat16": 2, "uint32": 4, "int32": 4, "float32": 4, "complex32": 4,
    "uint64": 8, "int64": 8, "float64": 8, "complex64": 8, "complex128": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
}


def itemsize(name):
    """Bytes of one element of a stored dtype name, or None if unknown."""
    return ITEMSIZE.get(name[3:] if name.startswith("np_") else name)


def torch_of(name):
    """The torch dtype a stored name (with or without "np_") stands for, or None."""
    return NAME_TO_TORCH.get(name[3:] if name.startswith("np_") else name)


def numpy_of(name):
    """The numpy dtype a stored name (with or without "np_") stands for, or None."""
    return NAME_TO_NUMPY.get(name if name.startswith("np_") else "np_" + name)


def torch_name(dtype):
    """The stored name of a torch dtype; TypeError if it has none."""
    n = TORCH_TO_NAME.get(dtype)
    if n is None:
        raise TypeError(
            f"torch dtype {dtype} has no stored name (supported: "
            f"{', '.join(sorted(NAME_TO_TORCH))})")
    return n


def numpy_name(dtype):
    """The stored name of a numpy dtype (native byte order); TypeError if none."""
    n = NUMPY_TO_NAME.get(dtype.newbyteorder("=") if dtype.byteorder != "|" else dtype)
    if n is None:
        raise TypeError(
            f"numpy dtype {dtype} has no stored name (supported: "
            f"{', '.join(sorted(x[3:] for x in NAME_TO_NUMPY))})")
    return n


_NATIVE = "=|" + ("<" if __import__("sys").byteorder == "little" else ">")


def native_order(a):
    """True if numpy array a's elements are in this machine's byte order."""
    return a.dtype.byteorder in _NATIVE


def is_tensor(x):
    return torch is not None and isinstance(x, torch.Tensor)


def is_array(x):
    return np is not None and isinstance(x, np.ndarray)
