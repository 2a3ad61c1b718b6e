"""A replica: one draft/target pair running the step loop (`Engine`) by itself, as a Ray actor.

Each replica holds its own Controller: the policy (a copy), its own cost model, refined from its
own step times, and an acceptance model that learns from its own steps and takes the pooled fit
the cluster pushes. The cluster talks to it once a round, not once a step: a round (`advance`)
brings new requests, cancellations and fresh parameters, runs up to `max_steps` steps (or
`max_s` seconds), and answers with what those steps committed and observed (`Progress`).

Restarts: Ray restarts a dead actor (`max_restarts`), re-running `__init__`, so the new
incarnation holds no sequences. Every answer names its incarnation; a round that expects another
one (the actor came back between two calls) is answered `lost=True` without stepping, and the
cluster re-sends its sequences from their committed tokens.
"""

from __future__ import annotations

import copy
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import ray
import torch

from specdepth.adaptive.acceptance import AcceptanceModel
from specdepth.adaptive.controller import Controller
from specdepth.adaptive.engine import Engine, EngineStats, Request, RequestOutput
from specdepth.workers.pair_spec import PairSpec, resolve_device
from specdepth.workers.runner import PairRunner
from specdepth.workers.sampler import SamplingParams



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
    max_restarts: int = 2  # Ray restarts of a dead actor before the cluster recreates it
    compile: str = "off"  # the passes' path: auto, on or off (workers/compiled.py)

    def __post_init__(self) -> None:
        if self.n_slots < 1 or self.max_depth < 0 or self.max_restarts < 0 or self.num_cpus < 0:
            raise ValueError(f"need n_slots >= 1, max_depth >= 0, max_restarts >= 0, num_cpus >= 0: {self}")


@dataclass
class Work:
    """Cluster -> replica, once a round."""

    incarnation: Optional[str]  # the incarnation the cluster expects; None: drop everything, start afresh
    add: list[tuple[int, Request]] = field(default_factory=list)  # (sequence id, request to continue)
    cancel: list[int] = field(default_factory=list)  # sequence ids to end now
    fit: Optional[dict] = None  # the pooled acceptance fit (`AcceptanceModel.fit_state`), None: keep the current one
    max_steps: int = 16  # steps this round, at most
    max_s: float = 0.1  # seconds this round, at most (checked between steps)
    stop_on_finish: bool = False  # end the round once a sequence leaves (the cluster has work waiting)


@dataclass
class SeqProgress:
    """One sequence's round: what it committed."""

    tokens: list[int] = field(default_factory=list)
    steps: int = 0
    verified: int = 0
    accepted: int = 0
    finish_reason: Optional[str] = None
    error: Optional[str] = None


@dataclass
class Progress:
    """Replica -> cluster, once a round."""

    incarnation: str
    pid: int
    lost: bool = False  # the replica did not hold the cluster's sequences: nothing was stepped
    seqs: dict[int, SeqProgress] = field(default_factory=dict)  # sequence id -> its round
    # the steps' observations, for the pooled acceptance model: (seq_ids (B,), top1 (B, J),
    # entropy (B, J), verified (B,), accepted (B,), finished (F,)) per step
    observations: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    stats: Optional[EngineStats] = None  # the round's counts and step log
    fallbacks: dict = field(default_factory=dict)  # policy faults this round, by kind
    handler_s: float = 0.0  # the whole call, inside the actor


class Replica:
    """One pair and its step loop. In-process usable; `ReplicaActor` is the Ray actor."""

    def __init__(self, config: ReplicaConfig, index: int = 0, policy: Any = None, cost: Any = None,
                 learn_cost: bool = True) -> None:
        self.config = config
        self.incarnation = uuid.uuid4().hex[:12]  # new after every (re)start
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        target, draft, self.eos_ids, self.name = config.pair.load(self.device)
        self.runner = PairRunner(target, draft, config.n_slots, config.max_depth, config.sampling,
                                 seed=config.seed + index, max_len=config.max_len, compile=config.compile)
        self.ctl: Optional[Controller] = None
        if policy is not None:
            # copies: arrays that come through Ray are read-only, and the cost model learns in place
            self.ctl = Controller(copy.deepcopy(policy), config.max_depth, cost=copy.deepcopy(cost),
                                  acceptance=AcceptanceModel(),
                                  learn_cost=learn_cost)
        self._reported: Counter[str] = Counter()  # policy faults already reported
        self._fresh()

    def _fresh(self) -> None:
        """An empty loop (every sequence dropped)."""
        for slot in list(self.runner.seqs):
            self.runner.remove(slot)
        self.engine = Engine(self.runner, self.ctl if self.ctl is not None else _draft_nothing, eos_ids=self.eos_ids)
        self.outs: dict[int, RequestOutput] = {}  # sequence id -> what the loop is filling

    def info(self) -> dict[str, Any]:
        r = self.runner
        return {"pid": os.getpid(), "incarnation": self.incarnation, "device": self.device,
                "device_name": torch.cuda.get_device_name() if self.device.startswith("cuda") else "cpu",
                "name": self.name, "eos_ids": self.eos_ids, "max_len": r.max_len,
                "vocab_size": r.vocab_size, "n_slots": r.n_slots, "max_depth": r.max_depth,
                "target_params": r.target.num_params(), "draft_params": r.draft.num_params()}

    def ping(self, payload: Any = None) -> Any:
        """Echo (for measuring the bare round trip)."""
        return payload

    def profile(self, quick: bool = False, repeats: int = 3) -> dict[str, Any]:
        """Time this replica's pair (`adaptive.profiler.profile`); returns the ProfiledCost dict."""
        from specdepth.adaptive.profiler import profile
        return profile(self.runner.target_pass, self.runner.draft_pass, quick=quick, repeats=repeats).to_dict()

    def set_cost(self, cost: Any) -> None:
        """Replace this replica's cost model (it goes on refining its own copy)."""
        if self.ctl is not None:
            self.ctl.cost = copy.deepcopy(cost)  # writable: it learns in place

    def advance(self, work: Work) -> Progress:
        """One round: apply `work`, step the loop, report what was committed and observed."""
        t0 = time.perf_counter()
        if work.incarnation is None:
            self._fresh()
        elif work.incarnation != self.incarnation:  # restarted since the cluster's last round
            return Progress(self.incarnation, os.getpid(), lost=True)
        eng = self.engine
        eng.stats = EngineStats(pos_verified=np.zeros(self.runner.max_depth, np.int64),
                                pos_accepted=np.zeros(self.runner.max_depth, np.int64))
        prog = Progress(self.incarnation, os.getpid())
        for sid in work.cancel:
            eng.cancel(sid)
        for sid, req in work.add:
            req.on_token = None
            prog.seqs[sid] = SeqProgress()
            try:
                self.outs[sid] = eng.submit(req, seq_id=sid)
            except ValueError as e:  # refused here (e.g. a resumed request past the context)
                prog.seqs[sid].finish_reason, prog.seqs[sid].error = "error", str(e)
        if work.fit is not None and self.ctl is not None:
            self.ctl.acceptance.load_fit(work.fit)
        before = {sid: (len(o.output_ids), o.steps, o.verified, o.accepted) for sid, o in self.outs.items()}
        steps = 0
        while eng.has_work() and steps < work.max_steps and time.perf_counter() - t0 < work.max_s:
            left = eng.step()
            steps += 1
            rec, eng.last_record = eng.last_record, None
            if rec is not None:
                prog.observations.append((rec.seq_ids, rec.result.top1, rec.result.entropy,
                                          rec.result.verified, rec.result.accepted, rec.finished))
            if left and work.stop_on_finish:
                break
        for sid, out in list(self.outs.items()):
            n, s, v, a = before.get(sid, (0, 0, 0, 0))
            p = prog.seqs.setdefault(sid, SeqProgress())
            p.tokens, p.steps, p.verified, p.accepted = out.output_ids[n:], out.steps - s, out.verified - v, \
                out.accepted - a
            if out.finish_reason is not None:
                p.finish_reason, p.error = out.finish_reason, None if out.error is None else str(out.error)
                del self.outs[sid]
        prog.stats = eng.stats
        if self.ctl is not None:
            prog.fallbacks = dict(self.ctl.fallbacks - self._reported)
            self._reported = Counter(self.ctl.fallbacks)
        prog.handler_s = time.perf_counter() - t0
        return prog



def _draft_nothing(seq_ids: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
    """A depth function for a replica without a policy: nothing drafted (tests, profiling)."""
    return np.zeros(len(seq_ids), np.int64)


ReplicaActor = ray.remote(Replica)


def create_replica(config: ReplicaConfig, index: int, num_gpus: float, policy: Any = None, cost: Any = None,
                   learn_cost: bool = True) -> Any:
    """Start one `ReplicaActor` (the handle returns at once; the pair loads in the actor).

    Args:
        config: the replica's configuration.
        index: replica number (its sampling seed offset).
        num_gpus: GPUs the actor holds (1 on GPU clusters, 0 on CPU).
        policy, cost, learn_cost: its Controller's (None policy: a replica that drafts nothing).
    """
    return ReplicaActor.options(num_gpus=num_gpus, num_cpus=config.num_cpus, max_restarts=config.max_restarts,
                                max_task_retries=0).remote(config, index, policy, cost, learn_cost)
