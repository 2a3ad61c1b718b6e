"""A replica on a real local Ray: its own step loop gives the target's greedy text and steps on
between exchanges, an answer reports what was committed and observed, the pooled fit is taken, a
nudge ends a waiting exchange, and a restart is reported instead of stepping blind."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from specdepth.adaptive.acceptance.model import AcceptanceModel
from specdepth.adaptive.cost.model import FixedCost
from specdepth.adaptive.engine import Request
from specdepth.adaptive.acceptance.state import FIT_KEYS
from specdepth.adaptive.replicas.replica import ReplicaConfig, Work, create_replica
from specdepth.policies.registry import make_policy
from specdepth.workers.pair_spec import PairSpec
from tests.pairs import tiny_pair
from tests.workers.test_lossless_greedy import reference_greedy

PAIR = dict(noise=0.15, seed=5)
CONFIG = ReplicaConfig(pair=PairSpec(factory="tests.pairs:tiny_pair", kwargs=PAIR), n_slots=4, max_depth=6,
                       threads=1, num_cpus=0.5, max_restarts=1)
PROMPTS = {10: [5, 6, 7], 11: [1, 2, 3, 4, 5, 6, 7, 8, 9], 12: [42]}


@pytest.fixture(scope="module")
def actor(ray_session):
    handle = create_replica(CONFIG, 0, num_gpus=0, policy=make_policy("dspark"),
                            cost=FixedCost(target_ms=10.0, draft_ms=0.5))
    yield handle
    ray_session.kill(handle, no_restart=True)


def test_exchanges_give_the_targets_greedy_text_and_report_their_steps(ray_session, actor):
    ray = ray_session
    info = ray.get(actor.info.remote())
    assert info["pid"] != os.getpid() and info["n_slots"] == 4 and info["max_depth"] == 6
    target, _ = tiny_pair(**PAIR)
    add = [(sid, Request(str(sid), p, 12)) for sid, p in PROMPTS.items()]
    inc, text, steps, finished = None, {sid: [] for sid in PROMPTS}, 0, {}
    work = Work(None, add, min_s=0.0)
    while len(finished) < len(PROMPTS):
        prog = ray.get(actor.exchange.remote(work))
        assert not prog.lost
        inc, steps = prog.incarnation, steps + prog.stats.steps
        for sid, p in prog.seqs.items():
            text[sid] += p.tokens
            assert p.verified >= p.accepted >= 0
            if p.finish_reason:
                finished[sid] = p.finish_reason
        for seq_ids, top1, entropy, verified, accepted, _ in prog.observations:  # the pooled model's food
            assert top1.shape == entropy.shape == (len(seq_ids), top1.shape[1])
            assert (accepted <= verified).all()
        work = Work(inc, min_s=0.0)
    assert finished == dict.fromkeys(PROMPTS, "length") and steps > 1
    for sid, toks in text.items():
        assert toks == reference_greedy(target, PROMPTS[sid], 12)


def test_the_loop_steps_on_between_exchanges(ray_session, actor):
    """After the first token's answer, the next answer waits for the finish (min_s is long): it
    carries every other token, from many steps that ran with no call made."""
    ray = ray_session
    target, _ = tiny_pair(**PAIR)
    first = ray.get(actor.exchange.remote(Work(None, [(1, Request("a", [3, 4], 40))])))
    assert len(first.seqs[1].tokens) >= 1 and first.seqs[1].finish_reason is None
    rest = ray.get(actor.exchange.remote(Work(first.incarnation, min_s=600, wait_s=600)))
    assert rest.seqs[1].finish_reason == "length" and rest.stats.steps > 1 and rest.busy_s > 0
    assert first.seqs[1].tokens + rest.seqs[1].tokens == reference_greedy(target, [3, 4], 40)


def test_a_nudge_ends_a_waiting_exchange(ray_session, actor):
    """A long request, an exchange that would wait for its finish, and nudges: the answer comes
    with the request still running; a cancel then ends it."""
    ray = ray_session
    first = ray.get(actor.exchange.remote(Work(None, [(2, Request("long", [5], 250, ignore_eos=True))])))
    ref = actor.exchange.remote(Work(first.incarnation, min_s=600, wait_s=600))
    while not ray.wait([ref], timeout=0.02)[0]:  # until one nudge lands while the exchange waits
        actor.nudge.remote()
    prog = ray.get(ref)
    assert prog.seqs.get(2) is None or prog.seqs[2].finish_reason is None  # answered before the end
    ray.get(actor.exchange.remote(Work(first.incarnation, cancel=[2])))  # may still carry a step from before
    after = ray.get(actor.exchange.remote(Work(first.incarnation, min_s=600, wait_s=600)))
    assert not after.lost and 2 not in after.seqs  # the cancel ended it: an idle replica answers at once


def test_an_exchange_takes_the_pooled_fit_and_continues_a_resumed_request(ray_session, actor):
    ray = ray_session
    target, _ = tiny_pair(**PAIR)
    acc = AcceptanceModel()
    rng = np.random.default_rng(0)
    for _ in range(40):
        acc.observe([1, 2], rng.uniform(0.2, 1, (2, 4)), rng.uniform(0, 2, (2, 4)), np.array([4, 4]),
                    rng.integers(0, 5, 2))
    fit = {k: acc.state_dict()[k] for k in FIT_KEYS}
    head = reference_greedy(target, [7, 8], 5)
    prog = ray.get(actor.exchange.remote(Work(None, [(3, Request("r", [7, 8] + head, 6))], fit=fit)))
    tokens = prog.seqs[3].tokens
    while prog.seqs[3].finish_reason is None:
        prog = ray.get(actor.exchange.remote(Work(prog.incarnation, min_s=600)))
        tokens += prog.seqs[3].tokens
    assert prog.seqs[3].finish_reason == "length"
    assert head + tokens == reference_greedy(target, [7, 8], 11)  # resumed: as if never cut


def test_a_restarted_actor_reports_lost_sequences(ray_session, actor):
    ray = ray_session
    # the answers that must hold tokens wait for the first one (a fresh process's first step can
    # take longer than the default half second on a loaded 2-core machine)
    first = ray.get(actor.exchange.remote(Work(None, [(7, Request("x", [1, 2], 20))], wait_s=60)))
    ray.kill(actor, no_restart=False)  # Ray restarts it (max_restarts=1): a fresh process, no sequences
    deadline, pid = time.time() + 60, first.pid
    while pid == first.pid:  # ray.kill is asynchronous; calls fail while Ray restarts the actor
        assert time.time() < deadline, "the actor did not come back within 60 s"
        try:
            pid = ray.get(actor.info.remote())["pid"]
        except ray.exceptions.RayActorError:
            time.sleep(0.2)
    again = ray.get(actor.exchange.remote(Work(first.incarnation)))
    assert again.lost and again.incarnation != first.incarnation and again.pid != first.pid
    resumed = ray.get(actor.exchange.remote(Work(None, [(7, Request("x", [1, 2] + first.seqs[7].tokens, 3))],
                                                 wait_s=60)))
    assert not resumed.lost and resumed.seqs[7].tokens
