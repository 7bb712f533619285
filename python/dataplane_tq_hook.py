"""Registers dataplane's TransferQueue backend in every Python process.

TransferQueue rebuilds its storage manager by name in each process that
attaches to it (a Ray worker or actor calling tq.init()), so the name
"Dataplane" must be known there even when that process never imports
dataplane. The file dataplane-tq.pth, installed beside this module, imports
it at interpreter start; all it does then is watch for the first import of
transfer_queue and import dataplane.tq right after it (which registers the
backend). A process that never imports transfer_queue pays one entry in
sys.meta_path and imports nothing else.

DP_TQ_AUTOREGISTER=0 in the environment turns it off (then import
dataplane.tq, or call dataplane.tq.register(), where TransferQueue is used).
"""

import os
import sys

_WATCHED = "transfer_queue"


class _Finder:
    """A meta path finder that finds nothing itself: when transfer_queue is
    about to be imported, it lets the other finders find it and wraps its
    loader so that dataplane.tq is imported once transfer_queue's own
    import has finished."""

    def find_spec(self, name, path=None, target=None):
        if name != _WATCHED:
            return None
        sys.meta_path.remove(self)  # once, and no recursion through us below
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


class _Loader:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, attr):
        return getattr(self._inner, attr)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            import dataplane.tq  # noqa: F401  (registers "Dataplane")
        except Exception as e:  # never break transfer_queue's own import
            sys.stderr.write(f"dataplane: TransferQueue backend not registered: {e}\n")


def install():
    """Watch for transfer_queue (idempotent; a no-op once it is imported)."""
    if os.environ.get("DP_TQ_AUTOREGISTER", "1") == "0":
        return
    if _WATCHED in sys.modules:  # already imported: register now
        try:
            import dataplane.tq  # noqa: F401
        except Exception as e:
            sys.stderr.write(f"dataplane: TransferQueue backend not registered: {e}\n")
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
