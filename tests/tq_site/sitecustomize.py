# Put on PYTHONPATH by the tests that run TransferQueue from a build tree: it
# does what an installed dataplane's dataplane-tq.pth does at interpreter
# start (import dataplane_tq_hook), so that every process TransferQueue and
# Ray start (workers, actors) knows the "Dataplane" backend.
import dataplane_tq_hook  # noqa: F401
