"""ReplicaActor on a real local Ray: steps like the in-process runner, runs the controller's
allocation locally from shipped parameters, and reports a restart instead of stepping blind."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from specdepth.adaptive.acceptance import AcceptanceModel
from specdepth.adaptive.cost_model import FixedCost
from specdepth.policies.registry import make_policy
from tests.pairs import tiny_pair
from tests.workers.test_lossless_greedy import reference_greedy
from specdepth.workers.actors import PairSpec, ReplicaConfig, StepParams, StepPlan, create_replica
from specdepth.workers.runner import PairRunner

PAIR = dict(noise=0.15, seed=5)
CONFIG = ReplicaConfig(pair=PairSpec(factory="tests.pairs:tiny_pair", kwargs=PAIR), n_slots=4, max_depth=6,
                       threads=1, num_cpus=0.5, max_restarts=1)
PROMPTS = {10: [5, 6, 7], 11: [1, 2, 3, 4, 5, 6, 7, 8, 9], 12: [42]}


def calibration(acc: AcceptanceModel) -> dict:
    st = acc.state_dict()
    return {k: st[k] for k in ("config", "weights", "global_rates", "cat_shift", "seq_ids", "seq_stats")}


@pytest.fixture(scope="module")
def actor(ray_session):
    handle = create_replica(CONFIG, 0, num_gpus=0)
    yield handle
    ray_session.kill(handle, no_restart=True)


def test_pair_spec_is_validated():
    with pytest.raises(ValueError, match="both"):
        PairSpec(target="t.safetensors")
    with pytest.raises(ValueError, match="module:function"):
        PairSpec(factory="tests.pairs.tiny_pair")
    with pytest.raises(ValueError, match="not both"):
        PairSpec(target="t", draft="d", factory="m:f")


def test_actor_steps_exactly_like_the_in_process_runner(ray_session, actor):
    ray = ray_session
    info = ray.get(actor.info.remote())
    assert info["pid"] != os.getpid() and info["n_slots"] == 4 and info["max_depth"] == 6
    target, draft = tiny_pair(**PAIR)
    local = PairRunner(target, draft, n_slots=4, max_depth=6)
    local_slots = {sid: local.add(p) for sid, p in PROMPTS.items()}
    rng = np.random.default_rng(0)
    ids = np.array(sorted(PROMPTS), np.int64)
    inc, emitted = None, {sid: [] for sid in PROMPTS}
    for step in range(6):
        budgets = rng.integers(0, 7, len(ids))
        plan = StepPlan(step, inc, reset=inc is None, remove=[],
                        add=[(s, PROMPTS[s]) for s in ids.tolist()] if inc is None else [],
                        seq_ids=ids, budgets=budgets)
        reply = ray.get(actor.step.remote(plan))
        assert not reply.lost and reply.handler_s > 0
        inc = reply.incarnation
        res = local.step(np.array([local_slots[s] for s in ids.tolist()]), budgets)
        assert reply.emitted == res.emitted  # budgets-only mode: everything drafted is verified
        np.testing.assert_array_equal(reply.verified, res.drafted)
        np.testing.assert_array_equal(reply.accepted, res.accepted)
        for sid, new in zip(ids.tolist(), reply.emitted):
            emitted[sid] += new
    for sid, toks in emitted.items():
        assert toks == reference_greedy(target, PROMPTS[sid], len(toks))

    # the controller's parameters: the replica runs dspark's causal verify locally
    acc = AcceptanceModel()
    params = StepParams(make_policy("dspark"), FixedCost(target_ms=10.0, draft_ms=0.5), calibration(acc))
    plan = StepPlan(6, inc, reset=False, remove=[12], add=[], seq_ids=ids[:2],
                    budgets=np.array([6, 6]), params=params)
    reply = ray.get(actor.step.remote(plan))
    assert not reply.lost and reply.conf.shape == reply.top1.shape
    assert (reply.verified <= reply.drafted).all() and (reply.accepted <= reply.verified).all()
    # the local calls' times travel back for the policy's measures (StepOutcome's keep, first
    # pass and verify times)
    assert reply.first_pass_s > 0 and reply.verify_s > 0 and reply.keep_s > 0  # budgets 6: keep_drafting asked
    np.testing.assert_allclose(reply.conf, acc.calibrate(ids[:2], reply.top1, reply.entropy) * (reply.top1 > 0))
    for sid, new in zip(ids[:2].tolist(), reply.emitted):
        n = len(emitted[sid]) + len(new)
        assert emitted[sid] + new == reference_greedy(target, PROMPTS[sid], n)


def test_round_trip_overhead_is_small(ray_session, actor):
    """One step call costs the step's own work plus about one bare round trip (printed)."""
    ray = ray_session
    ray.get(actor.ping.remote())
    t0 = time.perf_counter()
    for _ in range(20):
        ray.get(actor.ping.remote())
    bare = (time.perf_counter() - t0) / 20
    ray.get(actor.step.remote(StepPlan(100, None, True, [], [(1, [3, 4, 5])], np.array([1]), np.array([0]))))
    plan = StepPlan(101, None, True, [], [], np.zeros(0, np.int64), np.zeros(0, np.int64),
                    StepParams(make_policy("dspark"), FixedCost(), calibration(AcceptanceModel())))
    t0 = time.perf_counter()
    handler = 0.0
    for _ in range(20):
        handler += ray.get(actor.step.remote(plan)).handler_s
    with_params = (time.perf_counter() - t0) / 20
    print(f"\nbare round trip {bare * 1e3:.2f} ms; empty step with parameters {with_params * 1e3:.2f} ms "
          f"({handler / 20 * 1e3:.2f} ms inside the actor)")
    assert with_params < bare + 0.05  # loose: shared 2-core CI machines are noisy


def test_restarted_actor_reports_lost_sequences(ray_session, actor):
    ray = ray_session
    first = ray.get(actor.step.remote(StepPlan(0, None, True, [], [(7, [1, 2])], np.array([7]), np.array([2]))))
    ray.kill(actor, no_restart=False)  # Ray restarts it (max_restarts=1): a fresh process, no sequences
    deadline, pid = time.time() + 60, first.pid
    while pid == first.pid:  # ray.kill is asynchronous; calls fail while Ray restarts the actor
        assert time.time() < deadline, "the actor did not come back within 60 s"
        try:
            pid = ray.get(actor.info.remote())["pid"]
        except ray.exceptions.RayActorError:
            time.sleep(0.2)
    reply = ray.get(actor.step.remote(StepPlan(1, first.incarnation, False, [], [], np.array([7]), np.array([2]))))
    assert reply.lost and reply.incarnation != first.incarnation and reply.pid != first.pid
    again = ray.get(actor.step.remote(StepPlan(2, None, True, [], [(7, [1, 2] + first.emitted[0])],
                                               np.array([7]), np.array([2]))))
    assert not again.lost and again.emitted[0]
