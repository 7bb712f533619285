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
    "Error", "InvalidArgument", "OutOfMemory", "Timeout", "UnitFull", "Busy", "Lost",
    "ProtocolError", "TransferError", "Fatal", "PolicyError", "Closed", "SysError",
    "TooBig", "NotFound", "Exists", "Corrupt", "Unsupported", "Canceled", "Restarted",
]

__version__ = _core.version()


def version():
    """The C library's version (the package has the same)."""
    return _core.version()
