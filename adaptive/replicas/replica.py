"""A replica: one draft/target pair running the step loop (`Engine`) by itself, as a Ray actor.

Each replica holds its own Controller: the policy (a copy), its own cost model, refined from its
own step times, and an acceptance model that learns from its own steps and takes the pooled fit
the cluster pushes. A loop thread steps the engine whenever it holds sequences; it never waits on
the cluster. The cluster talks to it through `exchange`: a call hands over new requests,
cancellations and fresh parameters (`Work`), which the loop applies between two steps, and
answers with what the loop committed and observed since the last answer (`Progress`). An answer
goes back as soon as a sequence commits its first token or ends, otherwise once `min_s` has passed
since the last one; `nudge` ends a waiting call early, so a new request need not wait for it.

Restarts: Ray restarts a dead actor (`max_restarts`), re-running `__init__`, so the new
incarnation holds no sequences. Every answer names its incarnation; a call that expects another
one (the actor came back between two calls) is answered `lost=True`, and the cluster re-sends its
sequences from their committed tokens. Tokens the loop committed but no answer carried are not
lost: the cluster never saw them, and a resumed sequence produces them again.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import ray
import torch

from specdepth.adaptive.acceptance.model import AcceptanceModel
from specdepth.adaptive.controller import Controller
from specdepth.adaptive.engine import Engine, EngineStats, Request, RequestOutput
from specdepth.workers.drafters.registry import drafter_options
from specdepth.workers.linear import signature as linear_signature
from specdepth.workers.pair_spec import PairSpec, resolve_device
from specdepth.workers.runner import PairRunner
from specdepth.workers.sampler import SamplingParams

log = logging.getLogger("specdepth.replica")


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
    drafter: str = "model"  # what drafts: a name in workers.drafters.registry
    ngram: tuple[int, int] = (1, 4)  # the ngram drafter's (ngram_min, ngram_max)

    def __post_init__(self) -> None:
        if self.n_slots < 1 or self.max_depth < 0 or self.max_restarts < 0 or self.num_cpus < 0:
            raise ValueError(f"need n_slots >= 1, max_depth >= 0, max_restarts >= 0, num_cpus >= 0: {self}")


@dataclass
class Work:
    """Cluster -> replica, once an exchange."""

    incarnation: Optional[str]  # the incarnation the cluster expects; None: drop everything, start afresh
    add: list[tuple[int, Request]] = field(default_factory=list)  # (sequence id, request to continue)
    cancel: list[int] = field(default_factory=list)  # sequence ids to end now
    fit: Optional[dict] = None  # the pooled acceptance fit (`AcceptanceModel.fit_state`), None: keep the current one
    min_s: float = 0.02  # answer with plain new tokens no sooner than this after the last answer
    wait_s: float = 0.5  # answer after this long even with nothing new


@dataclass
class SeqProgress:
    """One sequence since the last answer: what it committed."""

    tokens: list[int] = field(default_factory=list)
    steps: int = 0
    verified: int = 0
    accepted: int = 0
    finish_reason: Optional[str] = None
    error: Optional[str] = None


@dataclass
class Progress:
    """Replica -> cluster: everything the loop did since the last answer."""

    incarnation: str
    pid: int
    lost: bool = False  # the replica did not hold the cluster's sequences: the work was not applied
    seqs: dict[int, SeqProgress] = field(default_factory=dict)  # sequence id -> its progress
    # the steps' observations, for the pooled acceptance model: (seq_ids (B,), top1 (B, J),
    # entropy (B, J), verified (B,), accepted (B,), finished (F,)) per step
    observations: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    stats: Optional[EngineStats] = None  # the steps' counts and step log
    fallbacks: dict = field(default_factory=dict)  # policy faults, by kind
    urgent: bool = False  # holds a first token, a finish or an error: answer at once
    busy_s: float = 0.0  # time the loop spent stepping
    step_age_s: float = 0.0  # how long the step now running has run (0: none running)


class Replica:
    """One pair and its step loop on a thread of its own. `ReplicaActor` is the Ray actor."""

    def __init__(self, config: ReplicaConfig, index: int = 0, policy: Any = None, cost: Any = None,
                 learn_cost: bool = True) -> None:
        self.config = config
        self.incarnation = uuid.uuid4().hex[:12]  # new after every (re)start
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        target, draft, self.eos_ids, self.name = config.pair.load(self.device)
        self.runner = PairRunner(target, draft, config.n_slots, config.max_depth, config.sampling,
                                 seed=config.seed + index, max_len=config.max_len, compile=config.compile,
                                 drafter=config.drafter, drafter_options=drafter_options(config.drafter, config.ngram))
        self.ctl: Optional[Controller] = None
        if policy is not None:
            # copies: arrays that come through Ray are read-only, and the cost model learns in place
            self.ctl = Controller(copy.deepcopy(policy), config.max_depth, cost=copy.deepcopy(cost),
                                  acceptance=AcceptanceModel(),
                                  learn_cost=learn_cost)
        self._reported: Counter[str] = Counter()  # policy faults already reported
        self._engine_lock = threading.Lock()  # the engine and runner: the loop, or a profile / set_cost
        self._cv = threading.Condition()  # guards everything below
        self._inbox: list[Work] = []
        self._gen = 0  # bumped by every reset: a step begun before one is not reported
        self._report = self._empty()
        self._last_answer = time.perf_counter()
        self._step_t0 = 0.0  # perf_counter when the step now running began (0: none)
        self._idle = True  # no sequences and nothing in the inbox
        self._nudged = False
        self._min_s: Optional[float] = None  # the waiting exchange's `Work.min_s` (None: none waits)
        self._error: Optional[str] = None  # the loop failed; cleared by a reset
        self.runner.warm_up()  # every pass width's linear kernels, before the first request pays them
        if self.ctl is not None:
            self.ctl.acceptance.warm_up()  # and the acceptance model's refit kernel (~6 s the first time on a machine)
        self._fresh()
        threading.Thread(target=self._loop, name="specdepth-replica-loop", daemon=True).start()

    def _empty(self) -> Progress:
        return Progress(self.incarnation, os.getpid(), stats=EngineStats.empty(self.runner.max_depth))

    def _fresh(self) -> None:
        """An empty loop (every sequence dropped)."""
        for slot in list(self.runner.seqs):
            self.runner.remove(slot)
        self.engine = Engine(self.runner, self.ctl if self.ctl is not None else _draft_nothing, eos_ids=self.eos_ids)
        self.outs: dict[int, RequestOutput] = {}  # sequence id -> what the loop is filling
        self._seen: dict[int, tuple[int, int, int, int]] = {}  # sequence id -> counts already reported

    # ---- calls ------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        r = self.runner
        return {"pid": os.getpid(), "incarnation": self.incarnation, "device": self.device,
                "device_name": torch.cuda.get_device_name() if self.device.startswith("cuda") else "cpu",
                "name": self.name, "eos_ids": self.eos_ids, "max_len": r.max_len,
                "vocab_size": r.vocab_size, "n_slots": r.n_slots, "max_depth": r.max_depth,
                "target_params": r.target.num_params(), "draft_params": r.draft.num_params(),
                "linear": linear_signature(r.target, r.draft)}

    def ping(self, payload: Any = None) -> Any:
        """Echo (for measuring the bare round trip)."""
        return payload

    def profile(self, quick: bool = False, repeats: int = 3) -> dict[str, Any]:
        """Time this replica's pair (`adaptive.cost.profiler.profile`); returns the ProfiledCost dict."""
        from specdepth.adaptive.cost.profiler import profile
        with self._engine_lock:
            return profile(self.runner.target_pass, self.runner.draft_pass, quick=quick, repeats=repeats).to_dict()

    def set_cost(self, cost: Any) -> None:
        """Replace this replica's cost model (it goes on refining its own copy)."""
        if self.ctl is not None:
            with self._engine_lock:
                self.ctl.cost = copy.deepcopy(cost)  # writable: it learns in place

    def nudge(self) -> None:
        """End the waiting `exchange` now (the cluster has new work for this replica)."""
        with self._cv:
            self._nudged = True
            self._cv.notify_all()

    def exchange(self, work: Work) -> Progress:
        """Hand `work` to the loop; answer with what it did since the last answer.

        Raises:
            RuntimeError: the loop failed (a bug, or a fault in the pair); a reset clears it.
        """
        with self._cv:
            if work.incarnation is not None and work.incarnation != self.incarnation:  # restarted
                return Progress(self.incarnation, os.getpid(), lost=True)
            if work.incarnation is None:  # what the loop did so far is not the cluster's any more
                self._gen += 1
                self._report, self._error = self._empty(), None
            self._inbox.append(work)
            self._idle, self._nudged = False, False
            self._cv.notify_all()
            deadline, self._min_s = time.perf_counter() + work.wait_s, work.min_s
            while self._error is None and not self._nudged and not self._ready(work.min_s):
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cv.wait(left)  # the loop notifies once an answer is due, not every step
            self._min_s = None
            if self._error is not None:
                raise RuntimeError(self._error)
            prog, self._report = self._report, self._empty()
            self._last_answer, self._nudged = time.perf_counter(), False
            prog.step_age_s = prog.step_age_s if not self._step_t0 else self._last_answer - self._step_t0
        return prog

    def _ready(self, min_s: float) -> bool:
        """Whether the report should go now (holding `_cv`)."""
        if self._inbox:
            return False  # the work is not applied yet
        r = self._report
        return r.urgent or self._idle or bool(r.seqs) and time.perf_counter() - self._last_answer >= min_s

    # ---- the loop thread --------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._inbox and (self._error is not None or not self.engine.has_work()):
                    self._idle = not self._inbox and not self.engine.has_work()
                    self._cv.notify_all()
                    self._cv.wait()
                inbox, self._inbox, gen = self._inbox, [], self._gen
                self._step_t0 = time.perf_counter()
            try:
                with self._engine_lock:
                    report = self._empty()
                    for work in inbox:
                        self._apply(work, report)
                    if self.engine.has_work():
                        self._step(report)
            except Exception as e:  # noqa: BLE001 - the cluster hears it from exchange and resets
                log.exception("replica: the loop failed")
                with self._cv:
                    self._error = f"the replica's loop failed: {type(e).__name__}: {e}"
                    self._step_t0 = 0.0
                    self._cv.notify_all()
                continue
            with self._cv:
                if gen == self._gen:
                    self._merge(report)
                self._step_t0 = 0.0
                if self._min_s is not None and self._ready(self._min_s):
                    self._cv.notify_all()

    def _apply(self, work: Work, report: Progress) -> None:
        if work.incarnation is None:
            self._fresh()
        for sid in work.cancel:
            self.engine.cancel(sid)
            self.outs.pop(sid, None)
            self._seen.pop(sid, None)
        for sid, req in work.add:
            req.on_token = None
            try:
                self.outs[sid] = self.engine.submit(req, seq_id=sid)
            except ValueError as e:  # refused here (e.g. a resumed request past the context)
                report.seqs[sid] = SeqProgress(finish_reason="error", error=str(e))
                report.urgent = True
        if work.fit is not None and self.ctl is not None:
            self.ctl.acceptance.load_fit(work.fit)

    def _step(self, report: Progress) -> None:
        """One engine step, and what it committed and observed, into `report`."""
        eng = self.engine
        t0 = time.perf_counter()
        eng.step()
        report.busy_s += time.perf_counter() - t0
        rec, eng.last_record = eng.last_record, None
        if rec is not None:
            report.observations.append((rec.seq_ids, rec.result.top1, rec.result.entropy,
                                        rec.result.verified, rec.result.accepted, rec.finished))
        report.stats, eng.stats = eng.stats, EngineStats.empty(self.runner.max_depth)
        for sid, out in list(self.outs.items()):
            n, s, v, a = self._seen.get(sid, (0, 0, 0, 0))
            if len(out.output_ids) == n and out.finish_reason is None:
                continue
            p = report.seqs.setdefault(sid, SeqProgress())
            p.tokens, p.steps, p.verified, p.accepted = out.output_ids[n:], out.steps - s, out.verified - v, \
                out.accepted - a
            report.urgent |= n == 0 and bool(p.tokens)
            self._seen[sid] = (len(out.output_ids), out.steps, out.verified, out.accepted)
            if out.finish_reason is not None:
                p.finish_reason, p.error = out.finish_reason, None if out.error is None else str(out.error)
                report.urgent = True
                del self.outs[sid], self._seen[sid]
        if self.ctl is not None:
            report.fallbacks = dict(self.ctl.fallbacks - self._reported)
            self._reported = Counter(self.ctl.fallbacks)

    def _merge(self, new: Progress) -> None:
        """Add one loop turn's report to the one waiting for the next answer (holding `_cv`)."""
        r = self._report
        for sid, p in new.seqs.items():
            q = r.seqs.setdefault(sid, SeqProgress())
            q.tokens += p.tokens
            q.steps, q.verified, q.accepted = q.steps + p.steps, q.verified + p.verified, q.accepted + p.accepted
            q.finish_reason, q.error = p.finish_reason, p.error
        r.observations += new.observations
        r.stats.add(new.stats)
        r.fallbacks = dict(Counter(r.fallbacks) + Counter(new.fallbacks))
        r.urgent |= new.urgent
        r.busy_s += new.busy_s


def _draft_nothing(seq_ids: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
    """A depth function for a replica without a policy: nothing drafted (tests, profiling)."""
    return np.zeros(len(seq_ids), np.int64)


ReplicaActor = ray.remote(max_concurrency=2)(Replica)  # exchange, and a nudge beside it
# glibc gives the loop thread an arena of its own, which it shrinks and regrows around every
# step's activations (page faults each step); one arena keeps those pages. Merged with the job's
# runtime_env; a value in the caller's environment wins.
ACTOR_ENV = {"MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "1")}


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
                                max_task_retries=0, runtime_env={"env_vars": ACTOR_ENV}
                                ).remote(config, index, policy, cost, learn_cost)
