"""ClusterController on a real local Ray: token-identical to the in-process Engine (greedy),
statistics pooled from every replica, replicas killed mid-run resume from committed tokens,
a replica that keeps dying is dropped, and a real `ray start` head runs a `ray job submit`."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from specdepth.adaptive.replicas.cluster import ClusterConfig, ClusterController, _Metrics
from specdepth.adaptive.controller import Controller
from specdepth.adaptive.engine import Engine, Request
from specdepth.policies.registry import make_policy
from tests.pairs import tiny_pair
from specdepth.adaptive.replicas.replica import ReplicaConfig
from specdepth.workers.pair_spec import PairSpec
from specdepth.workers.runner import PairRunner

REPO = Path(__file__).resolve().parents[3]
PAIR = dict(noise=0.15, seed=5)  # both replicas build the same weights from this seed


def requests(n: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(f"r{i}", rng.integers(0, 96, int(rng.integers(1, 12))).tolist(), int(rng.integers(6, 24)))
            for i in range(n)]


@pytest.fixture(scope="module")
def reference():
    """A fault-free in-process Engine run of 24 requests (greedy: depths do not change outputs)."""
    reqs = requests(24, seed=0)
    target, draft = tiny_pair(**PAIR)
    eng = Engine(PairRunner(target, draft, n_slots=4, max_depth=6), Controller(make_policy("dspark"), 6))
    return reqs, [o.output_ids for o in eng.run(reqs)], eng.stats.emitted


def cluster(replicas: int = 2, max_restarts: int = 2, max_failures: int = 3, cost=None,
            drafter: str = "model") -> ClusterController:
    rc = ReplicaConfig(pair=PairSpec(factory="tests.pairs:tiny_pair", kwargs=PAIR), n_slots=4, max_depth=6,
                       threads=1, num_cpus=0.5, max_restarts=max_restarts, drafter=drafter)
    return ClusterController(make_policy("dspark"), ClusterConfig(replicas=replicas, replica=rc,
                                                                  max_failures=max_failures), cost=cost)


def drive(cc: ClusterController, reqs: list[Request], hook=None):
    """Run to completion, calling hook(step) after every controller step; tokens streamed per request."""
    streamed: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    outs = [cc.submit(dataclasses.replace(r, on_token=lambda rid, toks: streamed[rid].extend(toks)))
            for r in reqs]
    n = 0
    while cc.has_work():
        cc.step()
        n += 1
        if hook:
            hook(n)
    return outs, streamed


def check_identical(outs, streamed, reference_outputs, cc, emitted_reference) -> None:
    assert [o.error for o in outs] == [None] * len(outs)
    assert [o.output_ids for o in outs] == reference_outputs
    assert [streamed[o.request_id] for o in outs] == reference_outputs  # nothing lost or streamed twice
    assert cc.stats.emitted == emitted_reference == sum(len(o.output_ids) for o in outs)


def test_matches_engine_and_pools_every_replicas_statistics(ray_session, reference):
    reqs, ref, emitted = reference
    with cluster() as cc:
        outs, streamed = drive(cc, reqs)
        check_identical(outs, streamed, ref, cc, emitted)
        per = cc.replica_observations()
        steps = [r.stats.steps for r in cc.replicas]
        print(f"\nobservations per replica {per}, pooled {cc.pooled_observations()}, steps {steps}, "
              f"acceptance length {cc.stats.acceptance_length:.2f}")
        assert all(v > 0 for v in per.values()) and all(s > 0 for s in steps)
        assert cc.pooled_observations() == sum(per.values())
        assert sum(r.stats.emitted for r in cc.replicas) == emitted
        assert cc.stats.acceptance_length > 1.5  # the local allocation verified draft tokens


def test_ngram_drafting_replicas_give_the_same_tokens(ray_session, reference):
    """Greedy output does not depend on the drafter: n-gram replicas match the model-drafted engine."""
    reqs, ref, emitted = reference
    with cluster(drafter="ngram") as cc:
        outs, streamed = drive(cc, reqs)
        check_identical(outs, streamed, ref, cc, emitted)
        assert cc.stats.acceptance_length > 1.0  # n-gram drafts were verified and accepted


def test_a_cost_priced_in_each_step_s_shape_travels_to_the_replicas(ray_session, reference):
    """A profiled cost with a decode table: the policy, holding the view bound to a step's batch,
    is shipped to the replicas with the controller's parameters (it once failed to unpickle)."""
    from tests.adaptive.cost.test_model import make_profiled
    base = make_profiled()
    reqs, ref, emitted = reference
    with cluster(cost=make_profiled(decode_s=base.target_table[:, [0, 3, 6]] * 0.8)) as cc:
        outs, streamed = drive(cc, reqs)
        check_identical(outs, streamed, ref, cc, emitted)


def test_killed_replicas_resume_from_committed_tokens(ray_session, reference):
    """Replica 0: ray.kill (Ray restarts it); then replica 1: its process SIGKILLed."""
    ray = ray_session
    reqs, ref, emitted = reference
    with cluster(max_restarts=2) as cc:
        r0, r1 = cc.replicas
        pids, killed = (r0.pid, r1.pid), []

        def hook(step: int) -> None:
            if not killed and step >= 3 and r0.seqs:
                ray.kill(r0.handle, no_restart=False)
                killed.append("ray.kill")
            elif len(killed) == 1 and r1.seqs:  # while replica 0 is still coming back
                os.kill(r1.pid, signal.SIGKILL)
                killed.append("SIGKILL")
        outs, streamed = drive(cc, reqs, hook)
        assert killed == ["ray.kill", "SIGKILL"]
        assert (r0.failures, r1.failures) == (1, 1) and r0.alive and r1.alive
        assert r0.pid != pids[0] and r1.pid != pids[1]  # both came back as new processes
        check_identical(outs, streamed, ref, cc, emitted)


def test_replica_that_keeps_dying_is_dropped_then_none_left_is_an_error(ray_session, reference):
    """max_restarts=0: Ray does not restart, the controller recreates; past max_failures it drops."""
    ray = ray_session
    reqs, ref, emitted = reference
    with cluster(max_restarts=0, max_failures=1) as cc:
        r0, r1 = cc.replicas

        def kill_when_back(rep):
            def hook(step: int) -> None:
                if step >= 2 and rep.alive and not rep.needs_reset and rep.seqs:  # up and serving
                    ray.kill(rep.handle, no_restart=False)
            return hook
        outs, streamed = drive(cc, reqs, kill_when_back(r0))
        assert not r0.alive and r0.failures == 2 and r1.alive and r1.failures == 0
        check_identical(outs, streamed, ref, cc, emitted)
        with pytest.raises(RuntimeError, match="no replica left"):
            drive(cc, requests(6, seed=1), kill_when_back(r1))


def test_metrics_that_cannot_be_recorded_switch_off_instead_of_failing_a_step():
    off = _Metrics(enabled=False, max_depth=4)
    off.record(lambda: 1 / 0)  # disabled: never called
    m = _Metrics(enabled=False, max_depth=4)
    m.on = True  # as if created, then the metrics agent went away
    m.record(lambda: 1 / 0)
    assert not m.on and not off.on


# ---- a real cluster: `ray start --head` + `ray job submit` ---------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jobs_cli_available() -> bool:
    """The `ray` CLI, and ray[default]'s aiohttp (the head's job server) and requests (jobs CLI)."""
    return shutil.which("ray") is not None and all(importlib.util.find_spec(m) for m in ("aiohttp", "requests"))


@pytest.mark.skipif(not _jobs_cli_available(), reason="needs the `ray` CLI with ray[default] (job server)")
def test_ray_job_submit_to_a_local_head():
    """A head on loopback with its own ports and temp dir (so it never meets the session's Ray),
    token auth on both sides; the job runs the specdepth CLI's --ray path, and its logs must
    hold the in-process answer."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="token", PYTHONPATH=str(REPO))
    tmp = tempfile.mkdtemp(prefix="sdray", dir="/tmp")  # short: Ray's unix sockets live under it
    ports = {k: _free_port() for k in ("port", "dashboard-port", "dashboard-agent-listen-port",
                                       "dashboard-agent-grpc-port", "ray-client-server-port",
                                       "metrics-export-port", "runtime-env-agent-port",
                                       "node-manager-port", "object-manager-port")}
    head_cmd = ["ray", "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--dashboard-host",
                "127.0.0.1", "--include-dashboard", "true", "--num-cpus", "2", "--temp-dir", tmp,
                "--disable-usage-stats", *[a for k, v in ports.items() for a in (f"--{k}", str(v))]]
    addr = f"http://127.0.0.1:{ports['dashboard-port']}"
    prompt, fixed = "def f(x):", ["--cost", "fixed:target_ms=10,draft_ms=1", "--threads", "1"]
    gen = [sys.executable, "-m", "specdepth.experiments.cli.main", "generate", "--prompt", prompt, "--max-new-tokens", "8"]
    local = subprocess.run(gen + fixed, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    entry, expected = ["specdepth", *gen[3:], "--ray", *fixed], local.stdout.strip()
    log = open(os.path.join(tmp, "head.log"), "w")
    head = subprocess.Popen(head_cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    job = f"specdepth-test-{os.getpid()}"

    def ray_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["ray", *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    try:
        deadline = time.time() + 120
        while ray_cli("job", "list", "--address", addr).returncode != 0:
            assert head.poll() is None and time.time() < deadline, open(log.name).read()[-3000:]
            time.sleep(1)
        sub = ray_cli("job", "submit", "--address", addr, "--submission-id", job, "--working-dir", str(REPO),
                      "--no-wait", "--", *entry, timeout=180)
        assert sub.returncode == 0, sub.stdout + sub.stderr
        deadline, done = time.time() + 300, None
        while done is None:  # `ray job status` ends with e.g. "Job 'x' succeeded"
            assert time.time() < deadline, "job still running after 300 s"
            time.sleep(1)
            st = ray_cli("job", "status", "--address", addr, job)
            done = re.search(r"\b(succeeded|failed|stopped)\b", st.stdout + st.stderr, re.IGNORECASE)
        logs = ray_cli("job", "logs", "--address", addr, job)
        assert done.group(1).lower() == "succeeded", logs.stdout[-3000:]
        assert expected in logs.stdout, (expected, logs.stdout[-3000:])
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops what it started
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(head.pid, signal.SIGKILL)  # anything left in its process group (ours alone)
        except ProcessLookupError:
            pass
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
