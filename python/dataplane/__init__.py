"""dataplane: put and get batches of tensors on a cluster of storage units.

    import dataplane, torch
    with dataplane.Client("/run/user/1000/dataplane") as c:
        c.put([0, 1], {"obs": torch.zeros(2, 84, 84)})
        obs = c.get([0, 1], ["obs"])["obs"]      # [tensor(84, 84), tensor(84, 84)]

See docs/python.md for the whole API, the TransferQueue backend (dataplane.tq),
threads, asyncio (AsyncClient) and fork rules.
"""

from . import _core
from ._core import (  # noqa: F401  (the exception classes)
    Error, InvalidArgument, OutOfMemory, Timeout, UnitFull, Busy, Lost,
    ProtocolError, TransferError, Fatal, PolicyError, Closed, SysError, TooBig,
    NotFound, Exists, Corrupt, Unsupported, Canceled, Restarted, Buffer,
)
from .client import Client, stack  # noqa: F401
from .aio import AsyncClient  # noqa: F401
from .direct import Transport, FetchRequest  # noqa: F401

__all__ = [
    "Client", "AsyncClient", "Transport", "FetchRequest", "Buffer", "stack", "version",
    "get_include", "get_lib",
    "Error", "InvalidArgument", "OutOfMemory", "Timeout", "UnitFull", "Busy", "Lost",
    "ProtocolError", "TransferError", "Fatal", "PolicyError", "Closed", "SysError",
    "TooBig", "NotFound", "Exists", "Corrupt", "Unsupported", "Canceled", "Restarted",
]

__version__ = _core.version()


def version():
    """The C library's version (the package has the same)."""
    return _core.version()


def get_include():
    """The directory holding dataplane/dataplane.h (cc -I...), for C code
    built against the library this package carries; None where the package
    was installed without it (a build tree, `make install`: use pkg-config)."""
    return _carried("include")


def get_lib():
    """The directory holding libdataplane.so (cc -L... -ldataplane, and
    -Wl,-rpath,... to find it at run time; lib/pkgconfig/dataplane.pc is
    there too); None where the package was installed without it."""
    return _carried("lib")


def _carried(name):
    import os

    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    return d if os.path.isdir(d) else None
