"""The cluster: requests spread over Ray replicas that each run the step loop themselves.

Every replica (adaptive/replicas/replica.py) runs `Engine` over its own pair on a loop thread: it plans,
drafts, verifies and prices its steps locally, and steps on while the cluster works, so no step
waits on a round trip. The cluster keeps one `exchange` call in flight per busy replica: it hands
out waiting requests (to the least-loaded replica with a free slot), streams the tokens each
answer carries to their requests, and pools every replica's acceptance observations in one
`AcceptanceModel`, whose fit goes back with the next exchange: the slightly stale freedom
DSpark's production scheduler takes. `ray.wait` hands back whichever answer comes first; a new
request or a cancellation (`wake`, from any thread) ends the waiting exchanges early.

The cluster owns every request's committed tokens (prompt + emitted): only what an answer
carried counts. When a replica fails (the actor died: `ray.kill`, a killed process, an error in
its loop), what it did since its last answer was never seen here, so nothing is lost or
duplicated: its sequences are re-sent with their committed tokens (re-prefill). Ray restarts the
actor (`max_restarts`); once Ray gives up, the cluster recreates it. A replica that fails more
than `max_failures` times is dropped and its requests move to the others; with none left,
RuntimeError. A step that runs longer than `step_timeout_s` kills (and so restarts) its actor.

Metrics (ray.util.metrics, tag `replica`): acceptance length, per-position acceptance,
verify-length histogram (the depth chosen), step time, goodput, emitted tokens, running sequences,
policy fallbacks, replica failures, and the queue length; off where Ray's metrics cannot be
recorded.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import ray

from specdepth.adaptive.acceptance.model import AcceptanceModel
from specdepth.adaptive.controller import check_depths
from specdepth.adaptive.engine import EngineStats, Request, RequestError, RequestOutput, submit_all, validate_request
from specdepth.adaptive.replicas.ray_local import init_ray
from specdepth.adaptive.replicas.replica import Progress, ReplicaConfig, Work, create_replica

log = logging.getLogger("specdepth.cluster")
RETRY_S = 0.2  # how soon to call a restarting actor again


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 1  # Ray actors, one draft/target pair each
    replica: ReplicaConfig = ReplicaConfig()
    max_batch: Optional[int] = None  # sequences per replica (default: its n_slots)
    max_failures: int = 3  # N: a replica failing more often than this is dropped
    # a replica answers with new tokens at most this often (first tokens and finishes at once); each
    # answer costs the replica's loop some time, so a batch job keeps them rare (serve: 0.02)
    stream_s: float = 0.1
    wait_s: float = 0.5  # an exchange with nothing to say answers after this long
    step_timeout_s: Optional[float] = 600.0  # a step slower than this kills (restarts) its actor
    restart_timeout_s: float = 300.0  # a failed replica still unavailable after this fails again
    metrics: bool = True  # export ray.util.metrics

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.max_failures < 0 or (self.max_batch is not None and self.max_batch < 1) \
                or self.stream_s < 0 or not self.wait_s > 0:
            raise ValueError(f"need replicas >= 1, max_failures >= 0, max_batch >= 1, stream_s >= 0, "
                             f"wait_s > 0: {self}")


@dataclass
class _Seq:
    seq_id: int
    req: Request
    out: RequestOutput

    @property
    def committed(self) -> list[int]:
        return self.out.prompt_ids + self.out.output_ids

    def rest(self) -> Request:
        """The request from its committed tokens on: what a replica continues."""
        return Request(self.req.request_id, self.committed, self.req.max_new_tokens - len(self.out.output_ids),
                       self.req.ignore_eos, sampling=self.req.sampling)  # a seed's noise is keyed by absolute position: it resumes


@dataclass
class ReplicaState:
    """The cluster's view of one replica."""

    rid: int
    handle: Any  # ray ActorHandle
    alive: bool = True
    seqs: set[int] = field(default_factory=set)  # sequence ids assigned to it
    pending_add: list[int] = field(default_factory=list)
    pending_cancel: list[int] = field(default_factory=list)
    needs_reset: bool = True  # resend every sequence (new or restarted actor)
    incarnation: Optional[str] = None
    pid: Optional[int] = None  # the actor process, as of its last answer
    inflight: Any = None  # ObjectRef of the exchange in flight
    fit_seen: float = -1.0  # pooled observations when its last fit was sent
    t_submit: float = 0.0
    failures: int = 0
    recovering: bool = False  # failed (counted) and not answered since
    recover_by: float = 0.0  # while recovering, "restarting" answers are retried until then
    retry_at: float = 0.0  # do not call before this (perf_counter), Ray is restarting it
    observations: float = 0.0  # counted observations it added to the pooled acceptance model
    fallbacks: Counter = field(default_factory=Counter)  # policy faults it reported
    faults_reported: int = 0  # policy fallbacks already exported as a metric
    stats: EngineStats = field(default_factory=EngineStats)
    busy_s: float = 0.0  # summed time its loop spent stepping (as its answers report)
    exchanges: int = 0  # answers taken
    controller_s: float = 0.0  # summed time in the cluster: building exchanges, pooling, streaming


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
            self.position = m.Gauge("specdepth_position_acceptance",
                                    "P(draft position j accepted | j-1 accepted), cumulative", ("replica", "position"))
            self.step_time = m.Histogram("specdepth_step_seconds", "draft + target time of one step",
                                         [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0], tags)
            self.running = m.Gauge("specdepth_running_sequences", "sequences a replica holds", tags)
            self.queue = m.Gauge("specdepth_queue_length", "requests waiting for a replica slot")
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

    def __init__(self, policy: Any, config: ClusterConfig = ClusterConfig(), cost: Any = None,
                 acceptance: Optional[AcceptanceModel] = None, eos_ids: Optional[tuple[int, ...]] = None,
                 learn_cost: bool = True) -> None:
        """
        Args:
            policy: the depth policy; every replica runs its own copy.
            config: replicas and their shape.
            cost: a cost model, copied to each replica, which refines its own; "profile": replica 0
                times its pair and every replica starts from that table; None: a fixed 1 ms /
                0.1 ms model.
            acceptance: the pooled acceptance model (default: a fresh one).
            eos_ids: end-of-sequence ids (default: the pair's).
            learn_cost: each replica refines its cost model from its measured step times.
        Raises:
            RuntimeError: a replica could not start.
        """
        check_depths(policy, config.replica.max_depth)
        init_ray()
        self.config, self.policy, self.learn_cost = config, policy, learn_cost
        self.acceptance = acceptance if acceptance is not None else AcceptanceModel()
        rc = config.replica
        self.num_gpus = rc.num_gpus if rc.num_gpus is not None else (
            1 if ray.cluster_resources().get("GPU", 0) > 0 else 0)
        self.cost = cost if not isinstance(cost, str) else None
        if isinstance(cost, str) and cost != "profile":
            raise ValueError(f"cost must be a cost model, 'profile' or None, got {cost!r}")
        handles = [self._create(i) for i in range(config.replicas)]
        try:
            self.infos = ray.get([h.info.remote() for h in handles])
        except ray.exceptions.RayError as e:
            for h in handles:
                _kill(h)
            raise RuntimeError(f"a replica failed to start: {e}") from e
        self.replicas = [ReplicaState(i, h, pid=inf["pid"], stats=EngineStats.empty(rc.max_depth))
                         for i, (h, inf) in enumerate(zip(handles, self.infos))]
        if cost == "profile":
            from specdepth.adaptive.cost.model import CostModel
            self.set_cost(CostModel.from_dict(ray.get(handles[0].profile.remote())))
        info = self.infos[0]
        self.max_len = min(inf["max_len"] for inf in self.infos)
        self.vocab_size = info["vocab_size"]
        self.max_batch = min(config.max_batch or rc.n_slots, rc.n_slots)
        self.eos_ids = set(info["eos_ids"] if eos_ids is None else eos_ids)
        self.queue: deque[_Seq] = deque()
        self.seqs: dict[int, _Seq] = {}  # running: sequence id -> request
        self.seq_no = 0
        self.stats = EngineStats.empty(rc.max_depth)
        self.metrics = _Metrics(config.metrics, rc.max_depth)

    def _create(self, rid: int) -> Any:
        rc = self.config.replica
        return create_replica(rc, rid, self.num_gpus, self.policy, copy.deepcopy(self.cost), self.learn_cost)

    def profiled_cost(self) -> Any:
        """Replica 0's pair profiled on the path it serves, once: cached under specdepth's cache
        directory (SPECDEPTH_CACHE or ~/.cache/specdepth), keyed by the pair, device, path and the
        machine's few-row linear answers (workers/linear_choice.py)."""
        from specdepth.adaptive.cost.model import CostModel, load_cost
        from specdepth.workers.cache import cache_dir
        info = self.infos[0]
        name = info["name"].replace("/", "_").replace("|", "__")
        path = cache_dir() / (f"profile-v8-{name}-{info['device']}-compile-{self.config.replica.compile}"
                              f"-linear-{info.get('linear', 'default')}.json")
        if not path.exists():
            log.warning("profiling the pair on %s (once; cached at %s) ...", info["device"], path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(CostModel.from_dict(ray.get(self.replicas[0].handle.profile.remote())).to_json())
        return load_cost(path)

    def set_cost(self, cost: Any) -> None:
        """Every replica (and any recreated one) starts again from this cost model."""
        self.cost = cost
        ray.get([r.handle.set_cost.remote(copy.deepcopy(cost)) for r in self.alive()])

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
        """Policy faults over all replicas."""
        return sum((r.fallbacks for r in self.replicas), Counter())

    def replica_observations(self) -> dict[int, float]:
        return {r.rid: r.observations for r in self.replicas}

    def ping_s(self, rid: int = 0, n: int = 50) -> float:
        """Mean bare round trip to replica `rid` (an echo call), seconds."""
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
    def wake(self) -> None:
        """Ask the replicas' waiting exchanges to answer now (new work is here); any thread."""
        for rep in list(self.replicas):
            if rep.alive and rep.inflight is not None:
                rep.handle.nudge.remote()

    def step(self) -> None:
        """Send every replica with work and no exchange in flight its next one; take the first answer."""
        self._admit()
        now = time.perf_counter()
        for rep in self.alive():
            if rep.inflight is None and (rep.seqs or rep.pending_cancel) and rep.retry_at <= now:
                self._submit(rep)
        waiting = {r.inflight: r for r in self.alive() if r.inflight is not None}
        backoff = [r.retry_at - now for r in self.alive() if r.inflight is None and r.seqs]
        wake = max(min(backoff), 0.0) if backoff else None  # a restarting replica to ask again
        if not waiting:
            if wake is not None:
                time.sleep(wake)
            return
        limit = self._call_timeout()
        timeout = wake if limit is None else limit if wake is None else min(limit, wake)
        ready, _ = ray.wait(list(waiting), num_returns=1, timeout=timeout)
        if ready:
            self._process(waiting[ready[0]])
            return
        now = time.perf_counter()
        for rep in waiting.values():
            if limit is not None and now - rep.t_submit > limit:
                log.warning("replica %d: no answer for %.0f s; killing it", rep.rid, now - rep.t_submit)
                _kill(rep.handle, restart=True)  # its call now fails: handled as a failure

    def _call_timeout(self) -> Optional[float]:
        """An exchange unanswered this long means a wedged actor (a slow step is caught by its age)."""
        t = self.config.step_timeout_s
        return None if t is None else t + self.config.wait_s

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
        reset = rep.needs_reset or rep.incarnation is None
        add = sorted(rep.seqs) if reset else rep.pending_add
        pooled = self.pooled_observations()
        fit = None
        if pooled != rep.fit_seen and pooled > 0:
            fit, rep.fit_seen = self.acceptance.fit_state(), pooled
        work = Work(None if reset else rep.incarnation, [(i, self.seqs[i].rest()) for i in add],
                    [] if reset else rep.pending_cancel, fit, self.config.stream_s, self.config.wait_s)
        rep.pending_add, rep.pending_cancel = [], []
        rep.inflight = rep.handle.exchange.remote(work)
        rep.t_submit = time.perf_counter()
        rep.controller_s += rep.t_submit - t0

    def _process(self, rep: ReplicaState) -> None:
        ref, rep.inflight = rep.inflight, None
        try:
            prog: Progress = ray.get(ref)
        except ray.exceptions.RayError as e:
            self._failed(rep, e)
            return
        t0 = time.perf_counter()
        if prog.lost:
            self._failed(rep, RuntimeError(f"actor restarted between two exchanges (now pid {prog.pid}); "
                                           "its sequences were lost"))
            return
        rep.incarnation, rep.pid, rep.needs_reset = prog.incarnation, prog.pid, False
        rep.recovering = False
        rep.busy_s += prog.busy_s
        rep.exchanges += 1
        self._commit(rep, prog)
        before = self.pooled_observations()
        for seq_ids, top1, entropy, verified, accepted, finished in prog.observations:
            self.acceptance.observe(seq_ids, top1, entropy, verified, accepted)
            if len(finished):
                self.acceptance.forget(finished)
        rep.observations += self.pooled_observations() - before
        rep.fallbacks.update(prog.fallbacks)
        if prog.stats is not None:
            for st in (self.stats, rep.stats):
                st.add(prog.stats)
        self._record(rep, prog, time.perf_counter() - rep.t_submit)
        rep.controller_s += time.perf_counter() - t0
        limit = self.config.step_timeout_s
        if limit is not None and prog.step_age_s > limit:
            log.warning("replica %d: a step has run for %.0f s; killing it", rep.rid, prog.step_age_s)
            _kill(rep.handle, restart=True)  # its next exchange fails: handled as a failure

    def _commit(self, rep: ReplicaState, prog: Progress) -> None:
        """Stream what the answer carried to its requests; finished ones leave."""
        now = time.perf_counter()
        for sid, p in prog.seqs.items():
            seq = self.seqs.get(sid)
            if seq is None:  # cancelled here meanwhile
                continue
            out = seq.out
            out.steps += p.steps
            out.verified += p.verified
            out.accepted += p.accepted
            if p.tokens:
                if not out.output_ids:
                    out.t_first = now
                out.output_ids.extend(p.tokens)
                if seq.req.on_token is not None:
                    seq.req.on_token(seq.req.request_id, p.tokens)
            if p.finish_reason is not None:
                err = RequestError(seq.req.request_id, p.error) if p.error is not None else None
                seq.out.finish_reason, seq.out.error, seq.out.t_done = p.finish_reason, err, now
                del self.seqs[sid]
                rep.seqs.discard(sid)

    def cancel(self, request_id: str) -> bool:
        """End a request now (finish reason "cancelled"); False if it is not waiting or running."""
        for seq in list(self.queue) + list(self.seqs.values()):
            if seq.req.request_id != request_id:
                continue
            if seq in self.queue:
                self.queue.remove(seq)
            else:
                del self.seqs[seq.seq_id]
                for rep in self.replicas:
                    if seq.seq_id in rep.seqs:
                        rep.seqs.discard(seq.seq_id)
                        rep.pending_cancel.append(seq.seq_id)
            seq.out.finish_reason, seq.out.t_done = "cancelled", time.perf_counter()
            return True
        return False

    # ---- failures ---------------------------------------------------------------------------
    def _failed(self, rep: ReplicaState, err: Exception) -> None:
        """A replica that failed: what it did since its last answer was never seen; resend or drop."""
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
            rep.handle = self._create(rep.rid)
        rep.needs_reset, rep.incarnation, rep.fit_seen = True, None, -1.0
        rep.pending_add, rep.pending_cancel = [], []

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
    def _record(self, rep: ReplicaState, prog: Progress, wall_s: float) -> None:
        m, tags = self.metrics, {"replica": str(rep.rid)}
        emitted = sum(len(p.tokens) for p in prog.seqs.values())
        faults = sum(rep.fallbacks.values())
        new_faults, rep.faults_reported = faults - rep.faults_reported, faults
        verified = [int(d) for obs in prog.observations for d in obs[3]]
        step_s = [] if prog.stats is None else [row[2] + row[3] for row in prog.stats.step_log]
        pv, pa = rep.stats.pos_verified, rep.stats.pos_accepted
        positions = [(j, float(pa[j] / pv[j])) for j in range(len(pv)) if pv[j]]

        def record() -> None:
            m.accept.set(rep.stats.acceptance_length, tags)
            for d in verified:
                m.verify.observe(d, tags)
            for s in step_s:
                m.step_time.observe(s, tags)
            for j, rate in positions:
                m.position.set(rate, {"replica": tags["replica"], "position": str(j + 1)})
            m.running.set(len(rep.seqs), tags)
            m.queue.set(len(self.queue))
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
