"""Ray actors that host one draft/target pair each: one call per speculative step.

A `Replica` owns a `PairRunner` (one pair, one device) and the runner's sequences, keyed by the
controller's sequence ids. `ReplicaActor` is the same class as a Ray actor; `create_replica`
starts one with its GPU share and restart budget. The cluster controller
(`adaptive.cluster.ClusterController`) is the only caller.

One round trip per step. The controller sends a `StepPlan`: sequences to drop, sequences to
(re-)prefill from their committed tokens, the draft budgets L_r it planned, and its current
parameters (`StepParams`: the policy with its state, this replica's cost model, and the
acceptance model's fit plus the stepped sequences' histories). The replica rebuilds a local
`Controller` from them and runs `keep_drafting` and the causal `verify` itself, between its draft
passes and its target pass, as DSpark's production scheduler does; the parameters are as of the
controller's last observation, i.e. stale by at most the steps of other replicas still in flight.
The reply (`StepReply`) carries the emitted tokens, accepted counts, the features and the
confidences the policy was shown, and timings; the controller observes it (pooled statistics).

Why parameters, not budgets alone: verify lengths are chosen after drafting, from the drafted
positions' confidences, so a replica given only budgets must either verify everything it drafted
(losing the allocation) or call back mid-step (a second round trip). Measured on this project's
2-core CPU machine (local Ray 2.60; `experiments/bench_ray.py`, tests/workers/test_actors.py): a
bare actor round trip costs 0.65-0.8 ms, and 2-2.6 ms when the call itself lasts ~10 ms (the
driver's wake-up on a loaded 2-core machine, whatever the payload); a plan with the parameters
(3-4 KB pickled: policy + cost table + calibration) costs ~0.15 ms more in transit than one
without, plus ~0.25-0.3 ms to rebuild them in the replica. That is a third to a sixth of the
second round trip it replaces. `StepPlan.params = None` is the budgets-only mode (verify all).

Restarts: Ray restarts a dead actor (`max_restarts`), re-running `__init__`, so the new
incarnation holds no sequences. Every reply names its incarnation; a plan that expects another
one (the actor came back between two calls) is answered `lost=True` without stepping, and the
controller re-sends every sequence from its committed tokens with `reset=True`.
"""

from __future__ import annotations

import importlib
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import numpy as np
import ray
import torch

from specdepth.workers.runner import PairRunner
from specdepth.workers.sampler import SamplingParams

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class PairSpec:
    """Which draft/target pair a replica loads. Plain data: it travels to the actor.

    Neither paths nor factory: the bundled pair. `factory` ("module:function") is for pairs built
    in code, e.g. tests' random pairs: `PairSpec(factory="tests.pairs:tiny_pair", kwargs={"seed": 3})`;
    it returns (target, draft) or a `workers.bundled.Pair`.
    """

    target: Optional[str] = None  # .safetensors file or HF folder (with `draft`)
    draft: Optional[str] = None
    factory: Optional[str] = None  # "module:function" building the pair in the actor
    kwargs: dict = field(default_factory=dict)  # keyword arguments for `factory`
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: as loaded

    def __post_init__(self) -> None:
        if (self.target is None) != (self.draft is None):
            raise ValueError("give both target and draft paths, or neither")
        if self.factory is not None and self.target is not None:
            raise ValueError("give a factory or model paths, not both")
        if self.factory is not None and ":" not in self.factory:
            raise ValueError(f"factory must be 'module:function', got {self.factory!r}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {self.dtype!r}")

    def load(self, device: str) -> tuple[Any, Any, tuple[int, ...], str]:
        """Returns (target, draft, eos ids, name) on `device`, eval mode."""
        if self.factory is None:
            from specdepth.workers.bundled import load_pair
            pair = load_pair(self.target, self.draft, device)
        else:
            module, _, attr = self.factory.partition(":")
            pair = getattr(importlib.import_module(module), attr)(**self.kwargs)
        if isinstance(pair, tuple):  # (target, draft) from a factory: no tokenizer, no EOS
            (target, draft), eos, name = pair, (), f"{self.factory}({self.kwargs})"
        else:
            target, draft, eos, name = pair.target, pair.draft, tuple(pair.eos_ids), pair.name
        dtype = DTYPES.get(self.dtype)
        target, draft = (m.to(device=device, dtype=dtype).eval() for m in (target, draft))
        return target, draft, eos, name


@dataclass(frozen=True)
class ReplicaConfig:
    """One replica: its pair, its runner's shape, its Ray resources."""

    pair: PairSpec = PairSpec()
    n_slots: int = 16  # sequences one replica runs at once (KV cache slots)
    max_depth: int = 8  # K: largest draft budget
    max_len: Optional[int] = None  # context limit (default: the models')
    sampling: SamplingParams = SamplingParams()
    seed: int = 0  # sampling RNG seed (replica i uses seed + i)
    device: str = "auto"  # auto: cuda when the actor holds a GPU, else cpu
    threads: int = 0  # torch CPU threads inside the actor (0: torch's default)
    num_gpus: Optional[float] = None  # per actor; None: 1 if the cluster has GPUs, else 0
    num_cpus: float = 1.0  # per actor, for Ray's scheduling
    max_restarts: int = 2  # Ray restarts of a dead actor before the controller recreates it

    def __post_init__(self) -> None:
        if self.n_slots < 1 or self.max_depth < 0 or self.max_restarts < 0 or self.num_cpus < 0:
            raise ValueError(f"need n_slots >= 1, max_depth >= 0, max_restarts >= 0, num_cpus >= 0: {self}")


@dataclass
class StepParams:
    """The controller's current parameters, enough to run keep_drafting / verify locally."""

    policy: Any  # policies.base.DepthPolicy, with its state (Ray pickles it)
    cost: Any  # adaptive.cost_model.CostModel of this replica
    calibration: dict  # AcceptanceModel.state_dict() keys config, weights, global_rates, cat_shift, seq_ids, seq_stats


@dataclass
class StepPlan:
    """Controller -> replica, once per step."""

    step: int  # the controller's step number (unique over all replicas)
    incarnation: Optional[str]  # the replica incarnation the controller expects (None with reset)
    reset: bool  # drop every sequence first (after a failure, or when the replica was empty)
    remove: list[int]  # sequence ids that finished
    add: list[tuple[int, list[int]]]  # (sequence id, committed tokens: prompt + emitted so far)
    seq_ids: np.ndarray  # (B,) int64 sequences to step, in this order
    budgets: np.ndarray  # (B,) int64 draft budgets L_r
    params: Optional[StepParams] = None  # None: verify everything drafted (budgets-only mode)


@dataclass
class StepReply:
    """Replica -> controller, once per step. Rows follow `StepPlan.seq_ids`."""

    step: int
    incarnation: str
    pid: int
    lost: bool = False  # the replica did not hold the plan's sequences: nothing was stepped
    seq_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (B,) int64
    drafted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (B,) int64
    verified: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (B,) int64 d_r
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (B,) int64 a_r
    emitted: list = field(default_factory=list)  # B lists of a_r + 1 token ids ([] if failed)
    top1: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (B, J) draft top-1 probability
    entropy: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (B, J) nats
    conf: Optional[np.ndarray] = None  # (B, J) calibrated confidences the policy saw (None: no params)
    context_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (B,) before the step
    draft_s: float = 0.0  # draft passes' wall time
    target_s: float = 0.0  # verification pass wall time
    draft_passes: int = 0
    keep_s: float = 0.0  # inside the local keep_drafting calls (the policy's measure of its asks)
    first_pass_s: float = 0.0  # the first draft pass
    verify_s: float = 0.0  # the local causal verify calls (0: not asked)
    failed: dict = field(default_factory=dict)  # sequence id -> error message (that sequence only)
    fallbacks: dict = field(default_factory=dict)  # policy faults in local keep/verify this step
    prefill_s: float = 0.0  # (re-)prefilling added sequences
    params_s: float = 0.0  # rebuilding the controller's parameters
    handler_s: float = 0.0  # the whole call, inside the actor


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


class Replica:
    """One draft/target pair and its sequences. In-process usable; `ReplicaActor` is the actor."""

    def __init__(self, config: ReplicaConfig, index: int = 0) -> None:
        self.config = config
        self.incarnation = uuid.uuid4().hex[:12]  # new after every (re)start
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        target, draft, self.eos_ids, self.name = config.pair.load(self.device)
        self.runner = PairRunner(target, draft, config.n_slots, config.max_depth, config.sampling,
                                 seed=config.seed + index, max_len=config.max_len)
        self.slots: dict[int, int] = {}  # sequence id -> runner slot
        self._fallbacks: Counter[str] = Counter()  # kept across steps: each fault kind logs once

    def info(self) -> dict[str, Any]:
        r = self.runner
        return {"pid": os.getpid(), "incarnation": self.incarnation, "device": self.device,
                "device_name": torch.cuda.get_device_name() if self.device.startswith("cuda") else "cpu",
                "name": self.name, "eos_ids": self.eos_ids, "max_len": r.max_len,
                "vocab_size": r.vocab_size, "n_slots": r.tcache.n_slots, "max_depth": r.max_depth,
                "target_params": r.target.num_params(), "draft_params": r.draft.num_params()}

    def ping(self, payload: Any = None) -> Any:
        """Echo (for measuring the bare round trip)."""
        return payload

    def profile(self, quick: bool = False, repeats: int = 3) -> dict[str, Any]:
        """Time this replica's pair (`adaptive.profiler.profile`); returns the ProfiledCost dict."""
        from specdepth.adaptive.profiler import profile
        return profile(self.runner.target, self.runner.draft, quick=quick, repeats=repeats).to_dict()

    def step(self, plan: StepPlan) -> StepReply:
        t0 = time.perf_counter()
        if plan.reset:
            for sid in list(self.slots):
                self.runner.remove(self.slots.pop(sid))
        elif plan.incarnation != self.incarnation:
            # restarted since the controller's last call: it must resend everything
            return StepReply(plan.step, self.incarnation, os.getpid(), lost=True)
        for sid in plan.remove:
            if sid in self.slots:
                self.runner.remove(self.slots.pop(sid))
        t1 = time.perf_counter()
        if plan.add:
            new = self.runner.add_many([list(toks) for _, toks in plan.add])
            self.slots.update((sid, slot) for (sid, _), slot in zip(plan.add, new))
        t2 = time.perf_counter()
        if any(int(s) not in self.slots for s in plan.seq_ids):
            return StepReply(plan.step, self.incarnation, os.getpid(), lost=True)
        seq_ids = np.asarray(plan.seq_ids, np.int64)
        if not len(seq_ids):  # nothing to step (e.g. only removals)
            return StepReply(plan.step, self.incarnation, os.getpid(), prefill_s=t2 - t1,
                             handler_s=time.perf_counter() - t0)
        slots = np.array([self.slots[int(s)] for s in seq_ids], np.int64)
        ctx_lens = np.array([len(self.runner.seqs[s]) for s in slots], np.int64)
        ctl = self._controller(plan.params)
        t3 = time.perf_counter()
        before = Counter(self._fallbacks)
        res = self.runner.step(slots, np.asarray(plan.budgets, np.int64),
                               ctl.keep_fn(plan.step, seq_ids, plan.budgets) if ctl else None,
                               ctl.verify_fn(plan.step, seq_ids, ctx_lens) if ctl else None)
        conf = None
        if ctl is not None:  # what the policy was shown, as its verify callback computed it
            conf = ctl.shown_conf(plan.step, seq_ids, res.top1, res.entropy)
        reply = StepReply(plan.step, self.incarnation, os.getpid(), seq_ids=seq_ids, drafted=res.drafted,
                          verified=res.verified, accepted=res.accepted, emitted=res.emitted, top1=res.top1,
                          entropy=res.entropy, conf=conf, context_lens=ctx_lens, draft_s=res.draft_s,
                          target_s=res.target_s, draft_passes=res.draft_passes, keep_s=res.keep_s,
                          first_pass_s=res.first_pass_s, verify_s=ctl.verify_seconds(plan.step) if ctl else 0.0,
                          failed={int(seq_ids[r]): str(e) for r, e in res.failed.items()},
                          fallbacks=dict(self._fallbacks - before), prefill_s=t2 - t1, params_s=t3 - t2)
        reply.handler_s = time.perf_counter() - t0
        return reply

    def _controller(self, params: Optional[StepParams]):
        """A Controller holding the controller's parameters, or None (budgets-only mode)."""
        if params is None:
            return None
        from specdepth.adaptive.acceptance import AcceptanceConfig, AcceptanceModel
        from specdepth.adaptive.controller import Controller
        cal = params.calibration
        acc = AcceptanceModel(AcceptanceConfig(**cal["config"]))
        state = acc.state_dict()  # empty statistics: only the fit and histories are needed here
        state.update({k: cal[k] for k in ("weights", "global_rates", "cat_shift", "seq_ids", "seq_stats")})
        acc.load_state_dict(state)
        ctl = Controller(params.policy, self.config.max_depth, cost=params.cost, acceptance=acc,
                         learn_cost=False, time_verify=True)
        ctl.fallbacks = self._fallbacks
        return ctl


ReplicaActor = ray.remote(Replica)


def create_replica(config: ReplicaConfig, index: int, num_gpus: float) -> Any:
    """Start one `ReplicaActor` (the handle returns at once; the pair loads in the actor).

    Args:
        config: the replica's configuration.
        index: replica number (its sampling seed offset and actor name suffix).
        num_gpus: GPUs the actor holds (1 on GPU clusters, 0 on CPU).
    """
    return ReplicaActor.options(num_gpus=num_gpus, num_cpus=config.num_cpus, max_restarts=config.max_restarts,
                                max_task_retries=0).remote(config, index)
