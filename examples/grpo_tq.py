#!/usr/bin/env python3
"""grpo_tq: a GRPO-shaped pipeline through TransferQueue on dataplane.

Rollout workers (Ray actors) generate, for each prompt, a group of G
responses and put them into TransferQueue under their own partition
("rollout-w<i>") and keys ("s<step>-w<i>-p<prompt>-g<j>"), tagged with the
step. Each sample is

    prompt_ids    int64 tokens, jagged (the group's prompt, repeated)
    response_ids  int64 tokens, jagged
    old_logprobs  float32, one per response token (jagged)
    reward        float32, one per sample
    group         int64, the prompt's id (GRPO normalizes within it)

The trainer (this process) finds a step's keys with kv_list, gets them with
kv_batch_get, checks every value against a recomputation from the seed (and
the CRC-32 the worker reported for what it put), computes group-normalized
advantages, writes them back as a new field of the same keys, reads the
fields an actor update needs back (checked again), computes a policy-gradient
loss, and clears the keys. Rollouts of step s+1 run while the trainer works on
step s (one step off-policy, as asynchronous GRPO does).

By default TransferQueue starts a small local dataplane cluster (the
"Dataplane" backend's bootstrap); --cluster attaches to a running one.
Exit status: 0 when every value matched, 1 on any mismatch or error.

Build tree:  PYTHONPATH=build/python:tests/tq_site DP_CLI=build/dataplane \\
                 .venv/bin/python examples/grpo_tq.py
Installed:   python examples/grpo_tq.py
"""

import argparse
import os
import sys
import time
import warnings
import zlib

# torch warns that nested tensors are a prototype on every use
warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")

FIELDS = ("prompt_ids", "response_ids", "old_logprobs", "reward", "group")
SCALARS = ("reward", "group")  # one value per sample
VOCAB = 32000
EPS = 1e-6  # added to a group's reward std (a group of equal rewards gets 0 advantages)


def sample_seed(seed, step, worker, prompt):
    """The generator seed of one prompt's group: a fixed mix of its coordinates."""
    return (((seed * 1000003 + step) * 1009 + worker) * 9973 + prompt) % (2**63 - 1)


def make_group(seed, step, worker, prompt, group_size, sizes):
    """One prompt and its group of responses, as lists of per-sample tensors
    (a pure function of its arguments: the trainer calls it again to check
    what it got). sizes: (prompt_min, prompt_max, resp_min, resp_max) tokens."""
    import torch

    pmin, pmax, rmin, rmax = sizes
    g = torch.Generator().manual_seed(sample_seed(seed, step, worker, prompt))
    plen = int(torch.randint(pmin, pmax + 1, (1,), generator=g))
    prompt_ids = torch.randint(0, VOCAB, (plen,), generator=g, dtype=torch.int64)
    out = {f: [] for f in FIELDS}
    gid = (step * 1000 + worker) * 1000 + prompt  # unique over steps and workers
    for _ in range(group_size):
        rlen = int(torch.randint(rmin, rmax + 1, (1,), generator=g))
        out["prompt_ids"].append(prompt_ids.clone())
        out["response_ids"].append(torch.randint(0, VOCAB, (rlen,), generator=g,
                                                 dtype=torch.int64))
        # log-probs are negative; a stand-in for the policy's per-token output
        out["old_logprobs"].append(-torch.rand(rlen, generator=g, dtype=torch.float32) * 5)
        # a score in {0, 0.25, ..., 1} (a rule-based verifier's kind of reward)
        out["reward"].append(torch.randint(0, 5, (), generator=g).to(torch.float32) / 4)
        out["group"].append(torch.tensor(gid, dtype=torch.int64))
    return out


def crc(t):
    """CRC-32 of a tensor's dtype, shape and bytes."""
    import torch

    t = t.contiguous()
    head = f"{t.dtype}{tuple(t.shape)}".encode()
    return zlib.crc32(t.reshape(-1).view(torch.uint8).numpy().tobytes(), zlib.crc32(head))


def rows_of(value, scalar=False):
    """The per-sample tensors of a field TransferQueue returned. A field may
    come back dense (N, ...) or as a nested tensor of its rows, depending on
    the backend; a per-sample scalar may come back as 0-d rows or as rows of
    shape (1,): with scalar=True each row is returned 0-d."""
    rows = list(value.unbind())
    return [r.reshape(()) for r in rows] if scalar else rows


def as_td(cols):
    """A TensorDict of per-sample lists: token fields as jagged nested
    tensors, per-sample scalars as dense 1-D tensors."""
    import torch
    from tensordict import TensorDict

    n = len(cols["reward"])
    d = {}
    for f, vals in cols.items():
        if vals[0].dim() == 0:
            d[f] = torch.stack(vals)
        else:
            d[f] = torch.nested.as_nested_tensor(vals, layout=torch.jagged)
    return TensorDict(d, batch_size=[n])


def grpo_advantages(rewards, groups):
    """Group-normalized advantages: (r - mean of its group) / (std of its
    group + EPS), one per sample."""
    import torch

    adv = torch.empty_like(rewards)
    for gid in torch.unique(groups):
        m = groups == gid
        r = rewards[m]
        std = r.std(unbiased=False) if r.numel() > 1 else torch.zeros(())
        adv[m] = (r - r.mean()) / (std + EPS)
    return adv


def tq_conf(a):
    from omegaconf import OmegaConf

    if a.backend == "Dataplane":
        section = {"cluster": a.cluster} if a.cluster else {"units": a.units, "slab": a.slab}
    else:
        section = {}
    return OmegaConf.create({"controller": {"polling_mode": True},
                             "backend": {"storage_backend": a.backend, a.backend: section}})


def register_backend(backend):
    """Make sure the "Dataplane" backend is registered in this process. An
    installed dataplane (or tests/tq_site on PYTHONPATH) does it when
    transfer_queue is imported; importing dataplane.tq does it too."""
    if backend == "Dataplane":
        import dataplane.tq  # noqa: F401


class RolloutWorker:
    """Generates groups of responses and puts them into TransferQueue."""

    def __init__(self, worker, a):
        import torch

        torch.set_num_threads(1)
        register_backend(a.backend)
        import transfer_queue as tq

        tq.init()  # attaches to the TransferQueue the trainer started
        self.tq, self.worker, self.a = tq, worker, a
        self.partition = f"rollout-w{worker}"

    def rollout(self, step):
        """Put one step's samples; returns (worker, partition, keys, {key:
        [CRC-32 per field]}) for what was put."""
        a, w = self.a, self.worker
        cols = {f: [] for f in FIELDS}
        keys = []
        for p in range(a.prompts):
            grp = make_group(a.seed, step, w, p, a.group, a.sizes)
            for f in FIELDS:
                cols[f].extend(grp[f])
            keys.extend(f"s{step}-w{w}-p{p}-g{j}" for j in range(a.group))
        if a.corrupt and w == 0 and step == a.steps - 1:
            # self-test: the trainer must notice this one changed token
            cols["response_ids"][0] = cols["response_ids"][0].clone()
            cols["response_ids"][0][0] ^= 1
        sums = {k: [crc(cols[f][i]) for f in FIELDS] for i, k in enumerate(keys)}
        self.tq.kv_batch_put(keys=keys, partition_id=self.partition, fields=as_td(cols),
                             tags=[{"step": step, "worker": w} for _ in keys])
        return w, self.partition, keys, sums

    def close(self):
        self.tq.close()


class Checker:
    """Counts the tensors compared and collects mismatches (the first few
    are shown)."""

    def __init__(self):
        self.checked = 0
        self.bad = []

    def same(self, what, got, want):
        self.checked += 1
        if got.dtype != want.dtype or got.shape != want.shape:
            self.bad.append(f"{what}: got {got.dtype} {tuple(got.shape)}, want {want.dtype} "
                            f"{tuple(want.shape)}")
            return False
        diff = (got != want).reshape(-1).nonzero()
        if diff.numel():
            i = int(diff[0])
            self.bad.append(f"{what}: {diff.numel()} values differ, first at [{i}]: got "
                            f"{got.reshape(-1)[i].item()!r}, want {want.reshape(-1)[i].item()!r}")
            return False
        return True


def train_step(tq, a, step, worker, partition, keys, sums, chk):
    """The trainer's work on one worker's samples of one step; returns
    (samples, response tokens, loss)."""
    import torch
    from tensordict import TensorDict

    # the consumer's view: the step's keys from TransferQueue's own index
    listed = tq.kv_list(partition_id=partition).get(partition, {})
    found = sorted(k for k, tag in listed.items() if tag.get("step") == step)
    if found != sorted(keys):
        chk.bad.append(f"{partition} step {step}: kv_list has {len(found)} keys, the worker "
                       f"put {len(keys)}")
        return 0, 0, 0.0

    got = tq.kv_batch_get(keys=keys, partition_id=partition)
    rows = {f: rows_of(got[f], scalar=f in SCALARS) for f in FIELDS}
    # what the worker should have put, from the seed
    want = {f: [] for f in FIELDS}
    for p in range(a.prompts):
        grp = make_group(a.seed, step, worker, p, a.group, a.sizes)
        for f in FIELDS:
            want[f].extend(grp[f])
    for i, k in enumerate(keys):
        for j, f in enumerate(FIELDS):
            v = rows[f][i]
            chk.same(f"{partition}/{k}/{f}", v, want[f][i])
            if crc(v) != sums[k][j]:  # the worker's CRC of what it put
                chk.bad.append(f"{partition}/{k}/{f}: CRC-32 differs from the worker's")

    rewards = torch.stack(rows["reward"])
    groups = torch.stack(rows["group"])
    adv = grpo_advantages(rewards, groups)
    chk.same(f"{partition} step {step} advantages", adv,
             grpo_advantages(torch.stack(want["reward"]), torch.stack(want["group"])))
    # write the advantages back as a new field of the same samples
    tq.kv_batch_put(keys=keys, partition_id=partition,
                    fields=TensorDict({"advantages": adv}, batch_size=[len(keys)]))

    # the actor update reads what it needs (only these fields)
    upd = tq.kv_batch_get(keys=keys, partition_id=partition,
                          select_fields=["response_ids", "old_logprobs", "advantages"])
    adv2 = torch.stack(rows_of(upd["advantages"], scalar=True))
    chk.same(f"{partition} step {step} advantages read back", adv2, adv)
    loss_sum, tokens = 0.0, 0
    for i, (r, lp) in enumerate(zip(rows_of(upd["response_ids"]),
                                    rows_of(upd["old_logprobs"]))):
        chk.same(f"{partition}/{keys[i]}/response_ids (update)", r, want["response_ids"][i])
        chk.same(f"{partition}/{keys[i]}/old_logprobs (update)", lp, want["old_logprobs"][i])
        # policy gradient with ratio 1 (on-policy): -A * sum of log-probs
        loss_sum += float(-adv2[i] * lp.sum())
        tokens += r.numel()

    tq.kv_clear(keys=keys, partition_id=partition)
    left = set(tq.kv_list(partition_id=partition).get(partition, {})) & set(keys)
    if left:
        chk.bad.append(f"{partition} step {step}: {len(left)} keys left after kv_clear")
    return len(keys), tokens, loss_sum / max(tokens, 1)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="A GRPO-shaped pipeline through TransferQueue on dataplane: rollout "
                    "workers put jagged token ids, log-probs and rewards; the trainer gets "
                    "them, checks every value, computes group-normalized advantages, and "
                    "clears them.")
    ap.add_argument("--steps", type=int, default=4, help="training steps (default 4)")
    ap.add_argument("--workers", type=int, default=2, help="rollout actors (default 2)")
    ap.add_argument("--prompts", type=int, default=4,
                    help="prompts per worker per step (default 4)")
    ap.add_argument("--group", type=int, default=4,
                    help="responses per prompt, GRPO's G (default 4)")
    ap.add_argument("--prompt-len", default="8,32", help="prompt tokens min,max (default 8,32)")
    ap.add_argument("--response-len", default="16,128",
                    help="response tokens min,max (default 16,128)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backend", default="Dataplane", choices=["Dataplane", "SimpleStorage"],
                    help="TransferQueue storage backend (default Dataplane)")
    ap.add_argument("--cluster", help="attach to this dataplane cluster (cluster file, "
                    "directory or etcd:// URL) instead of starting a local one")
    ap.add_argument("--units", type=int, default=2, help="units of a local cluster (default 2)")
    ap.add_argument("--slab", default="256M", help="slab per unit of a local cluster "
                    "(default 256M)")
    ap.add_argument("--corrupt", action="store_true",
                    help="self-test: worker 0 changes one token after generating it at the "
                         "last step; the run must then fail")
    a = ap.parse_args(argv)
    try:
        pl = [int(x) for x in a.prompt_len.split(",")]
        rl = [int(x) for x in a.response_len.split(",")]
        assert len(pl) == 2 and len(rl) == 2 and 1 <= pl[0] <= pl[1] and 1 <= rl[0] <= rl[1]
    except (ValueError, AssertionError):
        ap.error("--prompt-len and --response-len take MIN,MAX with 1 <= MIN <= MAX")
    if min(a.steps, a.workers, a.prompts, a.group) < 1:
        ap.error("--steps, --workers, --prompts and --group must be >= 1")
    a.sizes = (pl[0], pl[1], rl[0], rl[1])
    return a


def main(argv=None):
    a = parse_args(argv)
    t0 = time.monotonic()
    # TransferQueue logs a warning per get on machines with fewer than 8
    # cores; keep its errors only (the Ray workers inherit this)
    os.environ.setdefault("TQ_LOGGING_LEVEL", "ERROR")
    import ray
    import torch

    register_backend(a.backend)
    import transfer_queue as tq

    torch.set_num_threads(1)
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:
        # logical CPUs: TQ's controller and SimpleStorage's units ask for one
        # each, more than a small machine has
        ray.init(num_cpus=a.workers + 4, include_dashboard=False)
    chk = Checker()
    samples = tokens = 0
    workers = []
    try:
        conf = tq.init(tq_conf(a))
        where = (conf.backend[a.backend].get("cluster") if a.backend == "Dataplane"
                 else "Ray actors")
        print(f"grpo_tq: TransferQueue on {a.backend} ({where}); {a.workers} workers x "
              f"{a.prompts} prompts x {a.group} responses per step", flush=True)
        actor = ray.remote(num_cpus=1)(RolloutWorker)
        workers = [actor.remote(w, a) for w in range(a.workers)]
        pending = [wk.rollout.remote(0) for wk in workers]
        for step in range(a.steps):
            done = ray.get(pending)
            # the next step's rollouts run while this one trains
            pending = ([wk.rollout.remote(step + 1) for wk in workers]
                       if step + 1 < a.steps else [])
            step_loss = 0.0
            for worker, partition, keys, sums in done:
                n, t, l = train_step(tq, a, step, worker, partition, keys, sums, chk)
                samples += n
                tokens += t
                step_loss += l
            print(f"grpo_tq: step {step}: {sum(len(d[2]) for d in done)} samples, "
                  f"loss {step_loss / len(done):+.4f}, "
                  f"{'ok' if not chk.bad else f'{len(chk.bad)} mismatches'}", flush=True)
        ray.get([wk.close.remote() for wk in workers])
    except Exception as e:
        import traceback

        traceback.print_exc()
        chk.bad.append(f"error: {type(e).__name__}: {e}")
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()
    for b in chk.bad[:10]:
        print(f"grpo_tq: MISMATCH {b}", file=sys.stderr)
    if len(chk.bad) > 10:
        print(f"grpo_tq: ... and {len(chk.bad) - 10} more", file=sys.stderr)
    status = "ok" if not chk.bad else f"FAILED ({len(chk.bad)} problems)"
    print(f"grpo_tq: {a.steps} steps, {samples} samples, {tokens} response tokens, "
          f"{chk.checked} tensors checked, backend {a.backend}, "
          f"{time.monotonic() - t0:.1f} s: {status}", flush=True)
    return 0 if not chk.bad else 1


if __name__ == "__main__":
    sys.exit(main())
