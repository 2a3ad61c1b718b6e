"""The cluster controller: continuous batching over Ray replicas, statistics pooled centrally.

`ClusterController` is `adaptive.engine.Engine` spread over `workers.actors.ReplicaActor`s (one
draft/target pair each, one GPU each on GPU clusters). It owns what must be global: the pooled
`AcceptanceModel` (every replica's observations go into it), the policy, one cost model per
replica, and every request's committed tokens (prompt + emitted). Each step of a replica is one
round trip (see workers/actors.py for the message and why it carries the controller's
parameters); replicas step concurrently: every idle replica with work gets its next plan, then
`ray.wait` hands back whichever reply comes first, which is observed, streamed and answered with
that replica's next plan. No replica waits for another.

Fault tolerance. A reply that does not come (the actor died: `ray.kill`, a killed process, an
exception) does not commit anything, so nothing emitted is lost or duplicated: the replica's
sequences are re-sent with their committed tokens (re-prefill) and redo that step. Ray restarts
the actor (`max_restarts`); once Ray gives up, the controller recreates it. A replica that fails
more than `max_failures` times is dropped and its requests move to the others; with none left,
RuntimeError. A step that takes longer than `step_timeout_s` kills (and so restarts) its actor.

Metrics (ray.util.metrics, tag `replica`): acceptance length, verify-length histogram, goodput,
policy fallbacks, emitted tokens, replica failures; silently off where Ray's metrics cannot be
recorded.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import numpy as np
import ray

from specdepth.adaptive.ray_local import init_ray

from specdepth.adaptive.acceptance import AcceptanceModel
from specdepth.adaptive.controller import Controller
from specdepth.adaptive.cost_model import CostModel, FixedCost
from specdepth.adaptive.engine import EngineStats, Request, RequestError, RequestOutput, commit_step, submit_all, validate_request
from specdepth.workers.actors import ReplicaConfig, StepParams, StepPlan, StepReply, create_replica

log = logging.getLogger("specdepth.cluster")
RETRY_S = 0.2  # how soon to call a restarting actor again


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 1  # Ray actors, one draft/target pair each
    replica: ReplicaConfig = ReplicaConfig()
    max_batch: Optional[int] = None  # sequences per replica (default: its n_slots)
    max_failures: int = 3  # N: a replica failing more often than this is dropped
    local_allocation: bool = True  # ship parameters, verify locally (False: verify all drafted)
    step_timeout_s: Optional[float] = 600.0  # a step slower than this kills (restarts) its actor
    restart_timeout_s: float = 300.0  # a failed replica still unavailable after this fails again
    metrics: bool = True  # export ray.util.metrics

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.max_failures < 0 or (self.max_batch is not None and self.max_batch < 1):
            raise ValueError(f"need replicas >= 1, max_failures >= 0, max_batch >= 1: {self}")


@dataclass
class _Seq:
    seq_id: int
    req: Request
    out: RequestOutput

    @property
    def committed(self) -> list[int]:
        return self.out.prompt_ids + self.out.output_ids


@dataclass
class ReplicaState:
    """The controller's view of one replica."""

    rid: int
    handle: Any  # ray ActorHandle
    ctl: Controller  # this replica's cost model; policy and acceptance are shared
    alive: bool = True
    seqs: set[int] = field(default_factory=set)  # sequence ids assigned to it
    pending_add: list[int] = field(default_factory=list)
    pending_remove: list[int] = field(default_factory=list)
    needs_reset: bool = True  # resend every sequence (new or restarted actor)
    incarnation: Optional[str] = None
    pid: Optional[int] = None  # the actor process, as of its last reply
    inflight: Any = None  # ObjectRef of the step in flight
    budgets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (B,) of that step
    t_submit: float = 0.0
    failures: int = 0
    recovering: bool = False  # failed (counted) and not answered since
    recover_by: float = 0.0  # while recovering, "restarting" answers are retried until then
    retry_at: float = 0.0  # do not call before this (perf_counter), Ray is restarting it
    observations: float = 0.0  # counted observations it added to the pooled acceptance model
    faults_reported: int = 0  # policy fallbacks already exported as a metric
    stats: EngineStats = field(default_factory=EngineStats)
    rtt_s: float = 0.0  # summed submit -> reply time (includes waiting behind other replies)
    handler_s: float = 0.0  # summed time inside the actor's step()
    params_s: float = 0.0  # of which: rebuilding the shipped parameters
    prefill_s: float = 0.0  # of which: (re-)prefilling added sequences
    controller_s: float = 0.0  # summed plan + observe + commit time in the controller


def _stats(max_depth: int) -> EngineStats:
    return EngineStats(pos_verified=np.zeros(max_depth, np.int64), pos_accepted=np.zeros(max_depth, np.int64))


def _kill(handle: Any, restart: bool = False) -> None:
    """Kill an actor (for good unless `restart`: then Ray restarts it); one already gone is fine."""
    try:
        ray.kill(handle, no_restart=not restart)
    except Exception as e:  # noqa: BLE001 - already dead or unreachable: nothing left to stop
        log.debug("kill: %s", e)


class _Metrics:
    """ray.util.metrics, tagged by replica; any failure turns them off (logged once)."""

    def __init__(self, enabled: bool, max_depth: int) -> None:
        self.on = False
        if not enabled:
            return
        try:
            from ray.util import metrics as m
            tags = ("replica",)
            self.accept = m.Gauge("specdepth_acceptance_length", "emitted tokens per sequence-step", tags)
            self.verify = m.Histogram("specdepth_verify_length", "verify length d_r per sequence-step",
                                      [j + 0.5 for j in range(max_depth + 1)], tags)
            self.goodput = m.Gauge("specdepth_goodput_tokens_per_s", "emitted tokens per second", tags)
            self.fallbacks = m.Counter("specdepth_policy_fallbacks_total", "policy faults fallen back", tags)
            self.emitted = m.Counter("specdepth_emitted_tokens_total", "emitted tokens", tags)
            self.failures = m.Counter("specdepth_replica_failures_total", "replica deaths and errors", tags)
            self.on = True
        except Exception as e:  # noqa: BLE001 - metrics are optional
            log.info("ray metrics off: %s", e)

    def record(self, fn: Callable[[], None]) -> None:
        if not self.on:
            return
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - e.g. no metrics agent: never fail a step for it
            log.info("ray metrics off: %s", e)
            self.on = False


class ClusterController:
    """Serve requests on Ray replicas; same Request/RequestOutput as `adaptive.engine.Engine`."""

    def __init__(self, policy: Any, config: ClusterConfig = ClusterConfig(),
                 cost: Union[CostModel, str, None] = None, acceptance: Optional[AcceptanceModel] = None,
                 eos_ids: Optional[tuple[int, ...]] = None, learn_cost: bool = True) -> None:
        """
        Args:
            policy: the depth policy (one, shared by all replicas; its state is pooled too).
            config: replicas and their shape.
            cost: a cost model, copied per replica; "profile": replica 0 times its pair and every
                replica starts from that table; None: a fixed 1 ms / 0.1 ms model.
            acceptance: the pooled acceptance model (default: a fresh one).
            eos_ids: end-of-sequence ids (default: the pair's).
            learn_cost: refine each replica's cost model from its measured step times.
        Raises:
            RuntimeError: a replica could not start.
        """
        init_ray()
        self.config, self.policy = config, policy
        self.acceptance = acceptance if acceptance is not None else AcceptanceModel()
        rc = config.replica
        self.num_gpus = rc.num_gpus if rc.num_gpus is not None else (
            1 if ray.cluster_resources().get("GPU", 0) > 0 else 0)
        handles = [create_replica(rc, i, self.num_gpus) for i in range(config.replicas)]
        try:
            self.infos = ray.get([h.info.remote() for h in handles])
        except ray.exceptions.RayError as e:
            for h in handles:
                _kill(h)
            raise RuntimeError(f"a replica failed to start: {e}") from e
        info = self.infos[0]
        if isinstance(cost, str):
            if cost != "profile":
                raise ValueError(f"cost must be a CostModel, 'profile' or None, got {cost!r}")
            cost = CostModel.from_dict(ray.get(handles[0].profile.remote()))
        base = cost if cost is not None else FixedCost(target_ms=1.0, draft_ms=0.1)
        self.replicas = [ReplicaState(i, h, Controller(policy, rc.max_depth, copy.deepcopy(base), self.acceptance,
                                                       learn_cost), pid=inf["pid"], stats=_stats(rc.max_depth))
                         for i, (h, inf) in enumerate(zip(handles, self.infos))]
        self.max_len = min(inf["max_len"] for inf in self.infos)
        self.vocab_size = info["vocab_size"]
        self.max_batch = min(config.max_batch or rc.n_slots, rc.n_slots)
        self.eos_ids = set(info["eos_ids"] if eos_ids is None else eos_ids)
        self.queue: deque[_Seq] = deque()
        self.seqs: dict[int, _Seq] = {}  # running: sequence id -> request
        self.seq_no = 0
        self.step_no = 0
        self.stats = _stats(rc.max_depth)
        self.metrics = _Metrics(config.metrics, rc.max_depth)
        self.last_reply: Optional[StepReply] = None  # the latest step reply (inspection, benchmarks)

    # ---- requests ---------------------------------------------------------------------------
    def validate(self, req: Request) -> None:
        """Raises RequestError naming the request for input that cannot be served."""
        validate_request(req, self.max_len, self.vocab_size)

    def submit(self, req: Request) -> RequestOutput:
        out = RequestOutput(req.request_id, list(req.prompt_ids), t_submit=time.perf_counter())
        self.validate(req)
        self.queue.append(_Seq(self.seq_no, req, out))
        self.seq_no += 1
        return out

    def has_work(self) -> bool:
        return bool(self.queue or self.seqs)

    def alive(self) -> list[ReplicaState]:
        return [r for r in self.replicas if r.alive]

    @property
    def fallbacks(self) -> Counter:
        """Policy faults over all replicas (plan faults here, keep/verify faults in the replicas)."""
        return sum((r.ctl.fallbacks for r in self.replicas), Counter())

    def replica_observations(self) -> dict[int, float]:
        return {r.rid: r.observations for r in self.replicas}

    def ping_s(self, rid: int = 0, n: int = 50) -> float:
        """Mean bare round trip to replica `rid` (an echo call), seconds; call between steps."""
        handle = self.replicas[rid].handle
        ray.get(handle.ping.remote())
        t0 = time.perf_counter()
        for _ in range(n):
            ray.get(handle.ping.remote())
        return (time.perf_counter() - t0) / n

    def pooled_observations(self) -> float:
        """Counted observations held by the pooled acceptance model."""
        return float(self.acceptance.cells[:, :, 0].sum())

    def _admit(self) -> None:
        """Waiting requests go to the least-loaded live replica with a free slot."""
        while self.queue:
            free = [r for r in self.alive() if len(r.seqs) < self.max_batch]
            if not free:
                return
            rep = min(free, key=lambda r: (len(r.seqs), r.rid))
            seq = self.queue.popleft()
            self.seqs[seq.seq_id] = seq
            rep.seqs.add(seq.seq_id)
            rep.pending_add.append(seq.seq_id)

    # ---- the loop ---------------------------------------------------------------------------
    def step(self) -> None:
        """Send every idle replica with work its next step, then process the first reply."""
        self._admit()
        now = time.perf_counter()
        for rep in self.alive():
            if rep.inflight is None and rep.seqs and rep.retry_at <= now:
                self._submit(rep)
        waiting = {r.inflight: r for r in self.alive() if r.inflight is not None}
        backoff = [r.retry_at - now for r in self.alive() if r.inflight is None and r.seqs]
        wake = max(min(backoff), 0.0) if backoff else None  # a restarting replica to ask again
        if not waiting:
            if wake is not None:
                time.sleep(wake)
            return
        timeout = self.config.step_timeout_s
        timeout = wake if timeout is None else timeout if wake is None else min(timeout, wake)
        ready, _ = ray.wait(list(waiting), num_returns=1, timeout=timeout)
        if ready:
            self._process(waiting[ready[0]])
            return
        now = time.perf_counter()
        for rep in waiting.values():
            if self.config.step_timeout_s is not None and now - rep.t_submit > self.config.step_timeout_s:
                log.warning("replica %d: no reply for %.0f s; killing it", rep.rid, now - rep.t_submit)
                _kill(rep.handle, restart=True)  # its call now fails: handled as a failure

    def run(self, requests: list[Request], progress: Optional[Callable[[int], None]] = None) -> list[RequestOutput]:
        """Serve all requests to completion; invalid ones come back with their error set.

        Raises:
            RuntimeError: every replica was dropped.
        """
        outs = submit_all(self, requests)
        while self.has_work():
            before = self.stats.emitted
            self.step()
            if progress:
                progress(self.stats.emitted - before)
        return outs

    def _submit(self, rep: ReplicaState) -> None:
        t0 = time.perf_counter()
        ids = sorted(rep.seqs)
        seqs = [self.seqs[i] for i in ids]
        seq_ids = np.array(ids, np.int64)
        ctx = np.array([len(s.out.prompt_ids) + len(s.out.output_ids) for s in seqs], np.int64)
        room = np.array([min(s.req.max_new_tokens - len(s.out.output_ids), self.max_len - n) - 1
                         for s, n in zip(seqs, ctx)], np.int64)
        budgets = np.minimum(rep.ctl.plan(self.step_no, seq_ids, ctx), np.maximum(room, 0))  # (B,)
        params = StepParams(self.policy, rep.ctl.cost, self.calibration(seq_ids)) \
            if self.config.local_allocation else None
        reset = rep.needs_reset or rep.incarnation is None
        add = ids if reset else rep.pending_add
        plan = StepPlan(self.step_no, None if reset else rep.incarnation, reset,
                        [] if reset else rep.pending_remove, [(i, self.seqs[i].committed) for i in add],
                        seq_ids, budgets, params)
        rep.pending_add, rep.pending_remove = [], []
        rep.inflight = rep.handle.step.remote(plan)
        rep.budgets, rep.t_submit = budgets, time.perf_counter()
        rep.controller_s += rep.t_submit - t0
        self.step_no += 1

    def calibration(self, seq_ids: np.ndarray) -> dict[str, Any]:
        """The acceptance model's fit and these sequences' histories (what `calibrate` reads)."""
        st = self.acceptance.state_dict()
        keep = np.isin(st["seq_ids"], seq_ids)
        return {"config": st["config"], "weights": st["weights"], "global_rates": st["global_rates"],
                "cat_shift": st["cat_shift"], "seq_ids": st["seq_ids"][keep], "seq_stats": st["seq_stats"][keep]}

    def _process(self, rep: ReplicaState) -> None:
        ref, rep.inflight = rep.inflight, None
        try:
            reply: StepReply = ray.get(ref)
        except ray.exceptions.RayError as e:
            self._failed(rep, e)
            return
        t0 = time.perf_counter()
        rep.rtt_s += t0 - rep.t_submit
        if reply.lost:
            self._failed(rep, RuntimeError(f"actor restarted between steps (now pid {reply.pid}); "
                                           "its sequences were lost"))
            return
        self.last_reply = reply
        rep.incarnation, rep.pid, rep.needs_reset = reply.incarnation, reply.pid, False
        rep.recovering = False
        rep.handler_s += reply.handler_s
        rep.params_s += reply.params_s
        rep.prefill_s += reply.prefill_s
        finished = self._commit(rep, reply)
        conf = reply.conf if reply.conf is not None else \
            self.acceptance.calibrate(reply.seq_ids, reply.top1, reply.entropy) * (reply.top1 > 0)
        before = self.pooled_observations()
        rep.ctl.observe(reply.step, reply.seq_ids, reply.context_lens, rep.budgets, reply.drafted,
                        reply.verified, reply.accepted, reply.top1, reply.entropy, reply.draft_s,
                        reply.target_s, reply.draft_passes, finished, conf=conf, keep_s=reply.keep_s,
                        first_pass_s=reply.first_pass_s, verify_s=reply.verify_s)
        rep.observations += self.pooled_observations() - before
        rep.ctl.fallbacks.update(reply.fallbacks)
        for st in (self.stats, rep.stats):
            st.steps += 1
            st.draft_s += reply.draft_s
            st.target_s += reply.target_s
            st.step_log.append((int((reply.verified + 1).sum()), int(reply.context_lens.sum()),
                                reply.draft_s, reply.target_s, reply.draft_passes, len(reply.seq_ids), math.nan))
        self._record(rep, reply, time.perf_counter() - rep.t_submit)
        rep.controller_s += time.perf_counter() - t0

    def _commit(self, rep: ReplicaState, reply: StepReply) -> np.ndarray:
        """Stream the emitted tokens to their requests (as Engine._commit); returns finished ids."""
        now = time.perf_counter()
        finished = []
        for r, sid in enumerate(reply.seq_ids.tolist()):
            seq = self.seqs[sid]
            req, out = seq.req, seq.out
            if sid in reply.failed:
                self._finish(rep, seq, "error", RequestError(req.request_id, reply.failed[sid]))
                finished.append(sid)
                continue
            reason = commit_step(req, out, reply.emitted[r], int(reply.verified[r]), int(reply.accepted[r]),
                                 [self.stats, rep.stats], self.eos_ids, now)
            if reason is None and len(seq.committed) >= self.max_len:
                reason = "context"
            if reason:
                self._finish(rep, seq, reason)
                finished.append(sid)
        return np.array(finished, np.int64)

    def _finish(self, rep: ReplicaState, seq: _Seq, reason: str, error: Optional[Exception] = None) -> None:
        seq.out.finish_reason, seq.out.error, seq.out.t_done = reason, error, time.perf_counter()
        del self.seqs[seq.seq_id]
        rep.seqs.discard(seq.seq_id)
        rep.pending_remove.append(seq.seq_id)

    # ---- failures ---------------------------------------------------------------------------
    def _failed(self, rep: ReplicaState, err: Exception) -> None:
        """A step that did not complete: nothing of it was committed; resend or drop."""
        now = time.perf_counter()
        if rep.recovering and isinstance(err, ray.exceptions.ActorUnavailableError) and now < rep.recover_by:
            rep.retry_at = now + RETRY_S  # Ray is still restarting it after the failure already counted
            return
        rep.failures += 1
        rep.recovering, rep.recover_by = True, now + self.config.restart_timeout_s
        self.metrics.record(lambda: self.metrics.failures.inc(1, {"replica": str(rep.rid)}))
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        if rep.failures > self.config.max_failures:
            log.warning("replica %d failed %d times (%s: %s); dropping it", rep.rid, rep.failures,
                        type(err).__name__, first)
            self._drop(rep, f"{type(err).__name__}: {first}")
            return
        log.warning("replica %d failed (%s: %s); its %d sequences resume from their committed tokens",
                    rep.rid, type(err).__name__, first, len(rep.seqs))
        if isinstance(err, ray.exceptions.ActorDiedError):  # Ray will not restart it: recreate
            _kill(rep.handle)
            rep.handle = create_replica(self.config.replica, rep.rid, self.num_gpus)
        rep.needs_reset, rep.incarnation = True, None
        rep.pending_add, rep.pending_remove = [], []

    def _drop(self, rep: ReplicaState, why: str) -> None:
        rep.alive = False
        _kill(rep.handle)
        for sid in sorted(rep.seqs, reverse=True):  # back to the front of the queue, in order
            self.queue.appendleft(self.seqs.pop(sid))
        rep.seqs.clear()
        if not self.alive():
            raise RuntimeError(f"no replica left: all {len(self.replicas)} replicas failed more than "
                               f"max_failures={self.config.max_failures} times; "
                               f"{len(self.queue)} requests unfinished; last error: {why}")

    # ---- metrics and shutdown ---------------------------------------------------------------
    def _record(self, rep: ReplicaState, reply: StepReply, wall_s: float) -> None:
        m, tags = self.metrics, {"replica": str(rep.rid)}
        emitted = sum(len(e) for e in reply.emitted)
        faults = sum(rep.ctl.fallbacks.values())  # plan faults here + keep/verify faults there
        new_faults, rep.faults_reported = faults - rep.faults_reported, faults

        def record() -> None:
            m.accept.set(rep.stats.acceptance_length, tags)
            for d in reply.verified.tolist():
                m.verify.observe(d, tags)
            m.goodput.set(emitted / max(wall_s, 1e-9), tags)
            m.emitted.inc(emitted, tags)
            if new_faults:
                m.fallbacks.inc(new_faults, tags)
        m.record(record)

    def shutdown(self) -> None:
        """Kill every replica actor (Ray itself stays up)."""
        for rep in self.replicas:
            if rep.alive:
                _kill(rep.handle)
                rep.alive = False

    def __enter__(self) -> "ClusterController":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
