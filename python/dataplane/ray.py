"""dataplane.ray: storage units as Ray actors.

    import ray, dataplane, dataplane.ray as dpray
    ray.init()
    h = dpray.start_cluster(units=4, slab="2G", name="rollouts")
    c = dataplane.Client(h.cluster)          # from any process of the job
    h2 = dpray.get_cluster("rollouts")       # the same handle, elsewhere
    h.shutdown()

Each unit is a `dataplane unit` process run by a Ray actor (no GPU, no CPU
reserved) on the node Ray places it on: "spread" puts them on different
nodes where it can (Ray's SPREAD), "pack" lets several share one (DEFAULT),
a list of node ids pins unit i to node i. Ray only starts the processes and
tells their addresses; it is never on the data path.

A unit process that dies is started again by its actor on the same node and
port, with the same unit id and cluster id (a new incarnation: clients
re-bind by themselves; what it held is gone), up to max_restarts times within
restart_window_s (as `dataplane up`); then the handle reports it down. An actor that dies takes its unit with it (the
process gets SIGTERM from the kernel when its parent dies), and the handle
says so. A cluster that is not detached ends with the driver; a detached one
lives until shutdown(). docs/ray.md says how this combines with the etcd
registry.
"""

import json
import os
import subprocess
import threading
import time
import uuid

import ray

from ._proc import die_with_parent, find_cli

_CONTROL = "dataplane-clusters"  # the namespace of the named control actors


def _cli():
    """The dataplane tool on this node (find_cli: $DP_CLI, PATH, beside the package)."""
    p = find_cli()
    if p is None:
        raise RuntimeError("dataplane.ray: no dataplane tool on this node (set DP_CLI, or "
                           "install dataplane here)")
    return p


class _Unit:
    """Runs one unit process and starts it again when it dies."""

    def __init__(self, index, n_units, cluster_id, slab, bind, advertise, options,
                 max_restarts, restart_window_s, start_timeout_s):
        self.index, self.n_units, self.cluster_id = index, n_units, cluster_id
        self.slab, self.bind, self.advertise = slab, bind, advertise
        self.options, self.max_restarts = list(options), max_restarts
        self.restart_window_s = restart_window_s  # None: a unit's whole life
        self.window = (0.0, 0)  # (monotonic start, restarts in it)
        self.start_timeout_s = start_timeout_s
        self.cli = _cli()
        self.port = 0  # the first start picks one; restarts keep it
        self.restarts, self.down, self.address, self.proc = 0, None, None, None
        self.peers = None  # every unit's address, once the cluster is up (repair)
        tmp = os.environ.get("TMPDIR", "/tmp")
        self.log = os.path.join(tmp, f"dataplane-ray-{cluster_id}-unit{index}.log")
        # Where its passes (--repair-every) find the cluster: a cluster file
        # set_peers writes once every unit is up (absent at the first start:
        # nothing to repair then). A registry, when given, is found instead.
        self.peers_file = os.path.join(tmp, f"dataplane-ray-{cluster_id}-unit{index}.json")
        self.own_source = not any(
            o in ("--registry", "--repair-from") or o.startswith(("--registry=", "--repair-from="))
            for o in options)
        self.lock = threading.Lock()
        self.stopping = False
        self._start()
        self.watcher = threading.Thread(target=self._watch, daemon=True,
                                        name=f"dataplane-unit{index}-watch")
        self.watcher.start()

    def _start(self):
        args = [self.cli, "unit", "--bind", self.bind, "--port", str(self.port),
                "--slab", str(self.slab), "--unit-id", str(self.index),
                "--units", str(self.n_units)]
        if not any(o == "--registry" or o.startswith("--registry=") for o in self.options):
            args += ["--cluster-id", self.cluster_id]  # (a registry's name is the id)
        if self.advertise:
            args += ["--advertise", self.advertise]
        if self.peers and self.restarts > 0:
            # started again: it fills itself from its peers (with --replicas > 1)
            args += ["--repair-from", ",".join(self.peers)]
        elif self.own_source:
            args += ["--repair-from", self.peers_file]
        args += self.options
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=log, env=env, preexec_fn=die_with_parent)
        # the first stdout line is the address; nothing else comes there
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("line", proc.stdout.readline()),
                             daemon=True)
        t.start()
        t.join(self.start_timeout_s)
        line = box.get("line", b"").decode(errors="replace").strip()
        if not line.startswith("tcp://"):
            proc.kill()
            proc.wait()
            with open(self.log, "rb") as f:
                tail = f.read()[-2000:].decode(errors="replace")
            raise RuntimeError(f"dataplane.ray: unit {self.index} did not start "
                               f"({' '.join(args)}):\n{tail}")
        self.address = line
        self.port = int(line.rsplit(":", 1)[1])
        self.proc = proc

    def _watch(self):
        while True:
            proc = self.proc
            rc = proc.wait()
            with self.lock:
                if self.stopping:
                    return
                why = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
                now = time.monotonic()
                since, n = self.window
                if self.restart_window_s and (n == 0 or now - since >= self.restart_window_s):
                    since, n = now, 0  # a new window opens at its first restart
                if n >= self.max_restarts:
                    within = (f" in {now - since:.0f} s (max_restarts {self.max_restarts} "
                              f"within {self.restart_window_s:g} s)"
                              if self.restart_window_s else
                              f" (max_restarts {self.max_restarts})")
                    self.down = (f"unit {self.index} died ({why}) after {n} restarts"
                                 + within)
                    return
                self.window = (since, n + 1)
                self.restarts += 1
                deadline = time.monotonic() + self.start_timeout_s
                while True:  # its port may take a moment to be free again
                    try:
                        self._start()
                        break
                    except RuntimeError as e:
                        if time.monotonic() > deadline:
                            self.down = f"unit {self.index} did not restart: {e}"
                            return
                        time.sleep(0.2)

    def set_peers(self, addresses):
        with self.lock:
            self.peers = list(addresses)
        if self.own_source:  # the cluster file of this unit's passes
            doc = {"version": 1, "cluster": self.cluster_id,
                   "units": [{"id": i, "zmq": a, "agent": f"unit-{i}"}
                             for i, a in enumerate(addresses)]}
            tmp = f"{self.peers_file}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.peers_file)

    def info(self):
        with self.lock:
            alive = self.down is None and self.proc is not None and self.proc.poll() is None
            return {"index": self.index, "address": self.address,
                    "node": ray.get_runtime_context().get_node_id(),
                    "pid": self.proc.pid if self.proc else None, "restarts": self.restarts,
                    "incarnation": self.restarts + 1,
                    "alive": alive, "down": self.down, "log": self.log}

    def stop(self, grace_s=10.0):
        with self.lock:
            self.stopping = True
            proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        try:
            os.remove(self.peers_file)
        except FileNotFoundError:
            pass
        return True


_UnitActor = ray.remote(num_cpus=0, max_restarts=0)(_Unit)


class _Control:
    """The named actor that holds a cluster's unit actors, so that any
    process of the job finds them by name (get_cluster)."""

    def __init__(self, name, units, cluster_id):
        self.name, self.units, self.cluster_id = name, units, cluster_id

    def handles(self):
        return self.units, self.cluster_id


_ControlActor = ray.remote(num_cpus=0)(_Control)


class ClusterHandle:
    """A cluster of units run by Ray actors (start_cluster, get_cluster).

    cluster: what Client, the TransferQueue backend and every command
    accept (the units' addresses, in unit order). units: one dict per unit
    (index, address, node, pid, incarnation: 1 for the first unit process
    and one more per restart, restarts, alive, down, log)."""

    def __init__(self, name, actors, cluster_id, control=None):
        self.name, self._actors, self.cluster_id = name, list(actors), cluster_id
        self._control = control
        self._infos = None

    @property
    def units(self):
        self._infos = [self._info(i, a) for i, a in enumerate(self._actors)]
        return self._infos

    def _info(self, i, actor):
        try:
            return ray.get(actor.info.remote(), timeout=30)
        except Exception as e:  # the actor died: its unit with it
            addr = self._infos[i]["address"] if self._infos else None
            return {"index": i, "address": addr, "node": None, "pid": None,
                    "incarnation": None, "restarts": None, "alive": False,
                    "down": f"unit {i}'s actor is gone ({type(e).__name__})", "log": None}

    @property
    def cluster(self):
        infos = self._infos or self.units
        return [u["address"] for u in infos]

    def down(self):
        """The units that are down, as {index: why}."""
        return {u["index"]: u["down"] for u in self.units if not u["alive"]}

    def stats(self):
        """Each unit's counters (dataplane.Client.stats())."""
        from .client import Client
        c = Client(self.cluster, connect_timeout_s=10)
        try:
            return c.stats()
        finally:
            c.close()

    def shutdown(self):
        """Stop every unit and its actor, and forget the name."""
        refs = [a.stop.remote() for a in self._actors]
        try:
            ray.get(refs, timeout=60)
        except Exception:
            pass  # an actor already gone took its unit with it
        for a in self._actors + ([self._control] if self._control else []):
            try:
                ray.kill(a)
            except Exception:
                pass
        self._actors = []


def start_cluster(units, slab="1G", *, placement="spread", name=None, detached=False,
                  bind=None, advertise=None, max_restarts=10, restart_window_s=600.0,
                  ssd_dir=None, staging=None,
                  registry=None, replicas=1, options=(), start_timeout_s=60.0):
    """Start `units` storage units of `slab` bytes each, each run by a Ray
    actor, and return a ClusterHandle.

    placement: "spread" (different nodes where possible), "pack" (several
    per node allowed), or a list of Ray node ids (unit i on node i). bind:
    the address units listen on (127.0.0.1 on a one-node Ray cluster,
    0.0.0.0 otherwise); advertise: the host they tell clients (default: the
    node's Ray address when binding every interface). max_restarts: how many
    times a unit process that dies is started again within restart_window_s
    seconds (counted from the first restart of a window; None: its whole
    life). ssd_dir / staging: the
    SSD tier (docs/operations.md, "SSD tier"). registry: an etcd URL
    (etcd://HOST:PORT/NAME) the units also register in, so that clients
    outside Ray find them there (a unit restarted by its actor registers
    again). replicas: copies of each row (1..3, at most units; docs/design.md,
    "Replicas"): a unit its actor starts again fills itself from its peers.
    options: more `dataplane unit` options. name:
    a name other processes of the job find it by (get_cluster); detached:
    outlive this driver (needs name; stop with shutdown())."""
    if not isinstance(units, int) or isinstance(units, bool) or units < 1:
        raise ValueError(f"start_cluster: units must be an int >= 1, got {units!r}")
    if restart_window_s is not None and not (
            isinstance(restart_window_s, (int, float)) and not isinstance(restart_window_s, bool)
            and 0 < restart_window_s < float("inf")):
        raise ValueError(f"start_cluster: restart_window_s must be seconds > 0, or None for "
                         f"a unit's whole life, got {restart_window_s!r}")
    if detached and not name:
        raise ValueError("start_cluster: a detached cluster needs a name (to find it later)")
    if (not isinstance(replicas, int) or isinstance(replicas, bool)
            or not 1 <= replicas <= min(3, units)):
        raise ValueError(f"start_cluster: replicas must be an int in 1..{min(3, units)} "
                         f"(at most 3 and the number of units), got {replicas!r}")
    if not ray.is_initialized():
        ray.init()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if isinstance(placement, (list, tuple)):
        if len(placement) != units:
            raise ValueError(f"start_cluster: {len(placement)} node ids for {units} units")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        strategies = [NodeAffinitySchedulingStrategy(n, soft=False) for n in placement]
    elif placement in ("spread", "pack"):  # Ray's default packs actors onto nodes
        strategies = ["SPREAD" if placement == "spread" else "DEFAULT"] * units
    else:
        raise ValueError(f"start_cluster: placement 'spread', 'pack' or a list of node ids, "
                         f"got {placement!r}")
    if bind is None:
        bind = "127.0.0.1" if len(nodes) <= 1 else "0.0.0.0"
    opts = list(options)
    if replicas > 1:
        opts += ["--replicas", str(replicas)]
    if ssd_dir:
        opts += ["--ssd-dir", str(ssd_dir)]
        if staging:
            opts += ["--staging", str(staging)]
    for i, o in enumerate(opts):
        if o == "--registry" or o.startswith("--registry="):
            if registry:
                raise ValueError("start_cluster: give the registry once (registry= or "
                                 "options, not both)")
            registry = o.split("=", 1)[1] if "=" in o else (
                opts[i + 1] if i + 1 < len(opts) else "")
            break
    else:
        if registry:
            opts += ["--registry", str(registry)]
    cluster_id = f"ray-{name or 'cluster'}-{uuid.uuid4().hex[:8]}"
    lifetime = {"lifetime": "detached"} if detached else {}
    ns = {"namespace": _CONTROL} if name else {}
    actors = []
    try:
        for i in range(units):
            actors.append(_UnitActor.options(scheduling_strategy=strategies[i], **lifetime,
                                             **ns).remote(
                i, units, cluster_id, slab, bind, advertise, opts, max_restarts,
                restart_window_s, start_timeout_s))
        infos = ray.get([a.info.remote() for a in actors])  # each started (or raises)
        addrs = [u["address"] for u in infos]
        ray.get([a.set_peers.remote(addrs) for a in actors])  # for their repairs
        control = None
        if name:
            control = _ControlActor.options(name=name, namespace=_CONTROL,
                                            **lifetime).remote(name, actors, cluster_id)
            ray.get(control.handles.remote())
    except BaseException:
        for a in actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        raise
    h = ClusterHandle(name, actors, cluster_id, control)
    h.units  # noqa: B018  (addresses known from now on)
    return h


def get_cluster(name):
    """The handle of the cluster start_cluster(..., name=name) started, from
    any process of the job (or of any job, for a detached one)."""
    try:
        control = ray.get_actor(name, namespace=_CONTROL)
    except ValueError:
        raise LookupError(f"no dataplane cluster named {name!r} on this Ray cluster") from None
    actors, cluster_id = ray.get(control.handles.remote())
    h = ClusterHandle(name, actors, cluster_id, control)
    h.units  # noqa: B018
    return h


# -- the direct transport as a Ray tensor transport --------------------------

from ray.experimental.rdt.tensor_transport_manager import (  # noqa: E402
    CommunicatorMetadata, FetchRequest, TensorTransportManager, TensorTransportMetadata)

_TRANSPORT = None  # this process's dataplane.Transport, made on first use
_RETIRED = []  # transports replaced after a failed fetch (see _retire)
_OWNERS = {}  # obj id -> the transport that published it
_PINNED = {}  # data_ptr -> a tensor register_memory keeps registered
_TRANSPORT_LOCK = threading.Lock()
_FETCH_TIMEOUT_S = float(os.environ.get("DP_RAY_FETCH_TIMEOUT_S", "300"))


def _transport():
    global _TRANSPORT
    with _TRANSPORT_LOCK:
        if _TRANSPORT is None:
            from .direct import Transport
            _TRANSPORT = Transport()
            for x in _PINNED.values():  # a new transport after a retired one
                _TRANSPORT.register(x)
        return _TRANSPORT


def _retire(t):
    """A fetch of t ended in an error: its publisher may have died while it
    wrote a reply into the shared-memory FIFO that every peer of t's UCX
    worker writes into, which then takes no message again, from any peer
    (docs/design.md, "UCX facts"). Later fetches and publishes get a new
    transport; t is kept, never closed (closing a UCX worker with sends
    pending to such a peer may abort the process), for the objects it
    published and the fetches it still runs."""
    global _TRANSPORT
    with _TRANSPORT_LOCK:
        if _TRANSPORT is t:
            _TRANSPORT = None
            _RETIRED.append(t)


class DataplaneTransportMetadata(TensorTransportMetadata):
    """Ray's tensor description plus the direct transport's metadata (the
    publisher's address, registration keys and spans)."""

    def __init__(self, tensor_meta, tensor_device, dp_metadata):
        super().__init__(tensor_meta=tensor_meta, tensor_device=tensor_device)
        self.dp_metadata = dp_metadata


class _Fetch(FetchRequest):
    def __init__(self, obj_id, req, transport):
        super().__init__(obj_id=obj_id, tensors=[])
        self.req = req
        self.transport = transport

    def __del__(self):
        req, self.req = getattr(self, "req", None), None
        if req is not None:
            try:
                req.close()
            except Exception:
                pass


class DataplaneTensorTransport(TensorTransportManager):
    """Ray's tensor transport over dataplane's direct transport: the source
    actor publishes the tensors (registered once, kept until Ray collects the
    object), the destination READs them one-sided. CPU tensors (and numpy
    arrays); a tensor the direct transport cannot describe (sparse, nested,
    on a device) is refused on the source with an error naming it, before
    anything moves."""

    def tensor_transport_backend(self):
        return "DATAPLANE"

    @staticmethod
    def is_one_sided():
        return True

    @staticmethod
    def can_abort_transport():
        return True

    def __init__(self):
        self._actors_ok = set()  # ids of actors known to have the transport

    def actor_has_tensor_transport(self, actor):
        # Ray asks on every .remote() of a DATAPLANE method: a round trip to
        # the actor each time (milliseconds). Whether the package imports in
        # an actor does not change, so a yes is remembered (a no is asked
        # again: the actor may be another incarnation next time).
        key = actor._actor_id.hex()
        if key in self._actors_ok:
            return True

        def has(self):
            try:
                import dataplane.direct  # noqa: F401
                return True
            except Exception:
                return False

        ok = ray.get(actor.__ray_call__.options(concurrency_group="_ray_system").remote(has))
        if ok:
            self._actors_ok.add(key)
        return ok

    def extract_tensor_transport_metadata(self, obj_id, rdt_object):
        import torch
        meta, device = [], None
        for i, t in enumerate(rdt_object):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"DATAPLANE transport: value {i} of object {obj_id} is a "
                                f"{type(t).__name__}, not a torch.Tensor")
            if t.is_nested or t.layout != torch.strided:
                raise TypeError(f"DATAPLANE transport: tensor {i} of object {obj_id} is "
                                f"{'nested' if t.is_nested else str(t.layout)}; only dense "
                                f"(strided) tensors can be sent (to_dense() it first)")
            if t.device.type != "cpu":
                raise TypeError(f"DATAPLANE transport: tensor {i} of object {obj_id} is on "
                                f"{t.device}; this transport sends CPU tensors (copy it to "
                                f"the CPU, or use a device transport)")
            device = device or t.device.type
            meta.append((t.shape, t.dtype))
        # contiguous copies where needed: the transport sends memory as laid out
        tensors = [t if t.is_contiguous() else t.contiguous() for t in rdt_object]
        t = _transport()
        md = t.publish(obj_id, tensors)
        with _TRANSPORT_LOCK:
            _OWNERS[obj_id] = t
        return DataplaneTransportMetadata(meta, device or "cpu", md)

    def get_communicator_metadata(self, src_actor, dst_actor, backend=None):
        return CommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata,
                              target_buffers=None):
        req = self.fetch_multiple_tensors(obj_id, tensor_transport_metadata,
                                          communicator_metadata, target_buffers)
        return self.wait_fetch_complete(req)

    def fetch_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata,
                               target_buffers=None):
        out = list(target_buffers) if target_buffers else None
        t = _transport()
        req = t.fetch(obj_id, tensor_transport_metadata.dp_metadata, out=out)
        return _Fetch(obj_id, req, t)

    def wait_fetch_complete(self, fetch_request, timeout=-1):
        from . import Canceled, Error, Timeout
        req = fetch_request.req
        try:
            tensors = req.wait(_FETCH_TIMEOUT_S if timeout is None or timeout < 0 else timeout)
        except Canceled:
            raise
        except Error as e:
            if req.done:  # ended in an error (not a wait that ran out): see _retire
                _retire(fetch_request.transport)
            if not isinstance(e, Timeout):
                raise
            raise TimeoutError(f"DATAPLANE transport: object {fetch_request.obj_id} not "
                               f"fetched in time: {e}") from None
        fetch_request.tensors = list(tensors)
        return fetch_request.tensors

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise NotImplementedError("DATAPLANE is one-sided: the receiver reads the tensors")

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors):
        # Ray may call this more than once for one object: freeing an id that
        # is gone already is harmless
        with _TRANSPORT_LOCK:
            t = _OWNERS.pop(obj_id, None)
        try:
            (t or _transport()).free(obj_id)
        except KeyError:
            pass

    def abort_transport(self, obj_id, communicator_metadata):
        # both sides: the source fails fetches of obj_id from now on; nothing
        # is freed here, so no READ still running can meet reused memory. A
        # fetch may run on a retired transport too
        with _TRANSPORT_LOCK:
            ts = list(_RETIRED)
        for t in [_transport()] + ts:
            try:
                t.abort(obj_id)
            except KeyError:
                pass


def register_memory(tensor):
    """Keep tensor's memory registered with this process's DATAPLANE
    transport for good (objects holding tensors inside it then skip their
    own registration), until deregister_memory(tensor)."""
    _transport().register(tensor)
    with _TRANSPORT_LOCK:
        _PINNED[tensor.data_ptr()] = tensor


def deregister_memory(tensor):
    """Drop what register_memory(tensor) kept (deregistered once no object
    published from it is still held)."""
    _transport().deregister(tensor)
    with _TRANSPORT_LOCK:
        _PINNED.pop(tensor.data_ptr(), None)
        retired = list(_RETIRED)
    for t in retired:
        try:
            t.deregister(tensor)
        except KeyError:
            pass


def register_transport(name="DATAPLANE"):
    """Register dataplane's direct transport with Ray as tensor transport
    `name`, for @ray.method(tensor_transport=name) between actors created
    afterwards by this process (Ray registers it on them). Idempotent."""
    import torch
    from ray.experimental import register_tensor_transport
    from ray.experimental.rdt import util
    util._ensure_default_transports_registered()
    if name.upper() in util.transport_manager_info:
        return name.upper()
    register_tensor_transport(name, ["cpu"], DataplaneTensorTransport, torch.Tensor)
    return name.upper()


def put(value, transport="DATAPLANE"):
    """ray.put(value, _tensor_transport=transport) from the driver or an
    actor: value's tensors stay in this process, published, and the process
    that gets the ref fetches them one-sided. Ray registers custom
    transports on a new actor with a task of its own, which the actor's
    first tasks may overtake (a plain ray.put there fails with "Invalid
    tensor transport: DATAPLANE"): in an actor this waits for that
    registration (up to 30 s, then registers the transport itself);
    elsewhere it registers the transport if needed."""
    from ray.experimental.rdt import util
    name = transport.upper()
    if ray.get_runtime_context().get_actor_id() is not None:
        end = time.monotonic() + 30
        while name not in util.transport_manager_info and time.monotonic() < end:
            time.sleep(0.002)
    if name not in util.transport_manager_info:
        register_transport(name)
    return ray.put(value, _tensor_transport=name)
