"""The controller around every policy: lossless with every built-in and with a randomised policy,
faulty policies fall back (counted) without breaking the run, the causal verify rule holds, and
user policies load from `module:attr` through the Python API and the CLI."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from specdepth.adaptive.acceptance.model import AcceptanceModel
from specdepth.adaptive.controller import Controller
from specdepth.adaptive.engine import Engine, Request
from specdepth.policies.base import DepthPolicy
from specdepth.policies.registry import list_policies, make_policy
from tests.pairs import tiny_pair
from tests.workers.test_lossless_greedy import reference_greedy
from specdepth.workers.runner import PairRunner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(noise=0.15, seed=5)


@pytest.fixture(scope="module")
def workload(pair):
    rng = np.random.default_rng(3)
    reqs = [Request(f"r{i}", rng.integers(0, 96, int(rng.integers(1, 12))).tolist(), int(rng.integers(4, 20)))
            for i in range(10)]
    return reqs, [reference_greedy(pair[0], r.prompt_ids, r.max_new_tokens) for r in reqs]


def run(pair, reqs, policy: DepthPolicy, max_batch: int = 4):
    ctl = Controller(policy, max_depth=8)
    eng = Engine(PairRunner(pair[0], pair[1], n_slots=max_batch, max_depth=8), ctl)
    return eng.run(reqs), ctl, eng


class RandomPolicy(DepthPolicy):
    """Random budgets, random early stops, random causal verify answers (seeded, explicit state)."""
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def plan(self, ctx):
        return self.rng.integers(0, ctx.max_depth + 1, ctx.batch_size)

    def keep_drafting(self, ctx):
        return self.rng.random(len(ctx.seq_ids)) < 0.8

    def verify(self, ctx):
        return self.rng.integers(0, ctx.drafted + 1)

    def verifies(self, step):
        return self.rng.random() < 0.7  # else every drafted token is verified

    def drafts_dynamically(self, step):
        return self.rng.random() < 0.7  # else every sequence drafts its budget, keep_drafting not asked


BUILTINS = [name for name, _, _ in list_policies() if name != "oracle"]


@pytest.mark.parametrize("spec", BUILTINS + ["static:k=8", "vllm-disable:k=4,threshold=3"])
def test_every_builtin_policy_is_lossless(pair, workload, spec):
    reqs, ref = workload
    outs, ctl, eng = run(pair, reqs, make_policy(spec))
    assert [o.output_ids for o in outs] == ref
    assert not ctl.fallbacks, ctl.fallbacks


def test_random_policy_is_lossless_and_speculates(pair, workload):
    reqs, ref = workload
    outs, ctl, eng = run(pair, reqs, RandomPolicy(1))
    assert [o.output_ids for o in outs] == ref
    assert eng.stats.pos_verified[:2].min() > 0


class Faulty(DepthPolicy):
    name = "faulty"

    def __init__(self, mode: str) -> None:
        self.mode, self.calls = mode, 0

    def plan(self, ctx):
        self.calls += 1
        if self.calls % 2:  # every other step is healthy, so speculation really happens
            return np.full(ctx.batch_size, 3)
        return {"raise": lambda: 1 / 0, "nan": lambda: np.full(ctx.batch_size, np.nan),
                "shape": lambda: np.ones(ctx.batch_size + 2), "negative": lambda: np.full(ctx.batch_size, -4),
                "huge": lambda: np.full(ctx.batch_size, 99), "string": lambda: "deep"}[self.mode]()

    def verify(self, ctx):
        if self.mode == "raise" and self.calls % 3 == 0:
            raise RuntimeError("verify broke")
        return ctx.drafted

    def verifies(self, step):
        if self.mode == "raise" and step % 5 == 0:
            raise RuntimeError("verifies broke")  # the controller asks `verify` that step
        return True

    def keep_drafting(self, ctx):
        return np.ones(len(ctx.seq_ids), bool)

    def drafts_dynamically(self, step):
        if self.mode == "raise" and step % 7 == 0:
            raise RuntimeError("drafts_dynamically broke")  # the controller asks `keep_drafting` that step
        return step % 2 == 0


@pytest.mark.parametrize("mode", ["raise", "nan", "shape", "negative", "huge", "string"])
def test_faulty_policy_falls_back_and_stays_lossless(pair, workload, mode):
    reqs, ref = workload
    outs, ctl, eng = run(pair, reqs, Faulty(mode))
    assert [o.output_ids for o in outs] == ref
    assert sum(ctl.fallbacks.values()) > 0, "the fault was counted"
    assert eng.stats.pos_verified[0] > 0, "healthy steps still speculated"


class PeekingPolicy(DepthPolicy):
    """Tries to leak: verifies position j only if position j + 1's confidence is high. The
    controller's causal calls never show it column j + 1, so it can never admit anything."""
    name = "peek"

    def plan(self, ctx):
        return np.full(ctx.batch_size, 4)

    def verify(self, ctx):
        j = ctx.conf.shape[1]
        nxt = ctx.conf[:, j] if j < ctx.conf.shape[1] else np.zeros(len(ctx.seq_ids))  # never there
        return np.where(nxt > 0.5, ctx.drafted, j - 1)


def test_verify_is_asked_causally(pair, workload):
    reqs, ref = workload
    seen = []

    class Spy(DepthPolicy):
        name = "spy"

        def plan(self, ctx):
            return np.full(ctx.batch_size, 3)

        def verify(self, ctx):
            seen.append(ctx.conf.shape[1])
            return ctx.drafted

    outs, _, _ = run(pair, reqs, Spy())
    assert [o.output_ids for o in outs] == ref
    assert set(seen) == {1, 2, 3}  # one call per position, each seeing only columns 1..j


class EveryOther(DepthPolicy):
    """Budgets of 3; an optional hook (`verifies` or `drafts_dynamically`, in subclasses) says yes
    on even steps only. Records the steps its hook-guarded method was called on and every outcome."""
    name = "every-other"

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.outcomes: list = []

    def plan(self, ctx):
        return np.full(ctx.batch_size, 3)

    def observe(self, out):
        self.outcomes.append(out)


def test_a_step_whose_verify_is_not_worth_asking_verifies_every_drafted_token(pair, workload):
    """`verifies(step)` False (asked right after `plan`): `verify` is not called that step and every
    drafted token is verified, as for a policy without `verify`; the outcome says no time was spent
    asking. Where the controller learns its cost model it times the calls it makes."""
    reqs, ref = workload

    class Sometimes(EveryOther):
        def verify(self, ctx):
            self.asked.append(ctx.step)
            return np.minimum(ctx.drafted, 1)  # would verify one position only

        def verifies(self, step):
            return step % 2 == 0

    outs, ctl, eng = run(pair, reqs, policy := Sometimes())
    asked, outcomes = policy.asked, policy.outcomes
    assert [o.output_ids for o in outs] == ref and not ctl.fallbacks
    assert asked and all(s % 2 == 0 for s in asked)
    odd = [o for o in outcomes if o.step % 2 and o.drafted.any()]
    assert odd and all((o.verified == o.drafted).all() and o.verify_time_s == 0.0 for o in odd)
    even = [o for o in outcomes if o.step % 2 == 0 and o.drafted.any()]
    assert any((o.verified < o.drafted).any() for o in even)  # the answers asked took effect
    assert all(o.verify_time_s > 0.0 for o in even)  # the default controller learns its cost model: timed
    outs, ctl, eng = run(pair, reqs, PeekingPolicy())
    assert [o.output_ids for o in outs] == ref
    assert eng.stats.pos_verified.sum() == 0


def test_a_step_not_drafted_dynamically_drafts_every_budget_without_asking(pair, workload):
    """`drafts_dynamically(step)` False (asked right after `plan`): `keep_drafting` is not called
    that step and every sequence drafts its budget, as for a policy without `keep_drafting`."""
    reqs, ref = workload

    class Fixed(EveryOther):
        def keep_drafting(self, ctx):
            self.asked.append(ctx.step)
            return np.zeros(len(ctx.seq_ids), bool)  # would stop after the first pass

        def drafts_dynamically(self, step):
            return step % 2 == 0

    outs, ctl, eng = run(pair, reqs, policy := Fixed())
    asked, outcomes = policy.asked, policy.outcomes
    assert [o.output_ids for o in outs] == ref and not ctl.fallbacks
    assert asked and all(s % 2 == 0 for s in asked)
    odd = [o for o in outcomes if o.step % 2 and o.drafted.any()]
    assert odd and any((o.drafted == 3).all() for o in odd) and all((o.drafted <= o.budgets).all() for o in odd)
    assert all(o.drafted.max() <= 1 for o in outcomes if o.step % 2 == 0)


def test_verify_arrays_do_not_carry_later_columns(pair, workload):
    """Slicing would hand over views whose .base holds positions j + 1..J; the contexts hold copies."""
    reqs, _ = workload
    wider = []

    class BasePeeker(DepthPolicy):
        name = "base-peek"

        def plan(self, ctx):
            return np.full(ctx.batch_size, 4)

        def verify(self, ctx):
            j = ctx.conf.shape[1]
            for a in (ctx.conf, ctx.top1, ctx.drafted):
                base = a.base if isinstance(a.base, np.ndarray) else None
                wider.append(base is not None and base.ndim == 2 and base.shape[1] > j)
            return ctx.drafted

    run(pair, reqs[:4], BasePeeker())
    assert wider and not any(wider)


POLICY_SRC = textwrap.dedent('''
    import os
    import numpy as np
    from specdepth.policies.base import DepthPolicy

    class MyPolicy(DepthPolicy):
        name = "mine"
        params = {"k": 2}

        def __init__(self, k=2):
            self.k, self.plans = k, 0

        def plan(self, ctx):
            self.plans += 1
            log = os.environ.get("MYPOLICY_LOG")
            if log:
                with open(log, "a") as f:
                    f.write(f"{ctx.batch_size}\\n")
            return np.full(ctx.batch_size, self.k)
''')


def test_custom_policy_from_module_api(pair, workload, tmp_path, monkeypatch):
    (tmp_path / "tmpmod.py").write_text(POLICY_SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    policy = make_policy("tmpmod:MyPolicy:k=3")
    assert policy.k == 3
    reqs, ref = workload
    outs, ctl, eng = run(pair, reqs, policy)
    assert [o.output_ids for o in outs] == ref
    assert policy.plans == eng.stats.steps > 0
    assert eng.stats.pos_verified[2] > 0 and eng.stats.pos_verified[3] == 0  # depth 3 drove it


def test_custom_policy_from_module_cli(tmp_path):
    (tmp_path / "tmpmod.py").write_text(POLICY_SRC)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "MYPOLICY_LOG": str(log),
           "SPECDEPTH_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-m", "specdepth.experiments.cli.main", "generate", "--prompt", "def f(x):",
                          "--max-new-tokens", "6", "--policy", "tmpmod:MyPolicy", "--json", "--drafter", "model",
                          "--cost", "fixed:target_ms=5,draft_ms=1", "--threads", "1"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rec["token_ids"]) == 6
    assert log.read_text().split() and rec["verified"] > 0  # our policy planned, depths were verified
    assert "policy mine(k=2)" in out.stderr


@pytest.fixture(scope="module")
def bundled():
    from specdepth.workers.bundled import heldout_prompts, load_pair
    pair = load_pair(device="cpu")
    prompts = [pair.tokenizer.encode(p) for p in heldout_prompts()[:4]]
    reqs = [Request(f"h{i}", p, 20, ignore_eos=True) for i, p in enumerate(prompts)]
    return pair, reqs, [reference_greedy(pair.target, r.prompt_ids, r.max_new_tokens) for r in reqs]


@pytest.mark.parametrize("spec", BUILTINS)
def test_every_builtin_policy_is_lossless_on_the_bundled_pair(bundled, spec):
    """The real pair, held-out prompts: every built-in's output equals the target's own greedy
    decoding (a full causal recompute, no cache), and the speculating ones did speculate."""
    pair, reqs, ref = bundled
    ctl = Controller(make_policy(spec), max_depth=8)
    eng = Engine(PairRunner(pair.target, pair.draft, n_slots=4, max_depth=8), ctl)
    assert [o.output_ids for o in eng.run(reqs)] == ref
    assert not ctl.fallbacks
    if spec != "off":
        assert eng.stats.pos_verified.sum() > 0, spec


def test_the_engine_reports_each_steps_time_outside_the_passes(pair, workload):
    from tests.adaptive.cost.test_model import make_profiled
    reqs, _ = workload
    cost = make_profiled()
    ctl = Controller(make_policy("static:k=2"), max_depth=8, cost=cost)
    ctl.cost_track = []  # each step's predictions, made before the step is learned from
    eng = Engine(PairRunner(pair[0], pair[1], n_slots=4, max_depth=8), ctl)
    eng.run(reqs)
    over = np.array([row[6] for row in eng.stats.step_log])
    assert over.shape == (eng.stats.steps,) and (over >= 0).all() and over.mean() > 0
    assert 0 < cost.step_overhead_s < 1.0  # learned from them (a running mean, bounded per step)
    track = np.array(ctl.cost_track)  # the first step reports no overhead yet: no row
    assert track.shape == (eng.stats.steps - 1, 6) and (track[:, [0, 3]] > 0).all()
    # nothing learned, then the first step's, capped at twice the prediction (0) + 1 ms: a first step pays one-off costs
    assert track[0, 2] == 0.0 and track[1, 2] == pytest.approx(min(over[0], 1e-3))
    # filling cost_track is the benchmark's, timed apart from the controller's own time
    assert eng.stats.track_s == pytest.approx(ctl.track_s) and ctl.track_s > 0 and eng.stats.control_s > 0


def test_a_model_free_drafters_proposing_is_in_the_whole_step_prediction(pair, workload):
    """A model-free drafter runs no pass, but its proposing takes host time (`draft_s`): the
    whole-step prediction holds what a drafting plan pays for it (`FreeDraftCost.drafting_s`,
    learned from the steps before), not 0."""
    from tests.adaptive.cost.test_model import make_profiled
    reqs, _ = workload
    ctl = Controller(make_policy("static:k=2"), max_depth=8, cost=make_profiled())
    ctl.cost_track = []
    eng = Engine(PairRunner(pair[0], pair[1], n_slots=4, max_depth=8, drafter="ngram"), ctl)
    row_s = []  # the proposing's price per row before each step is learned from
    observe = ctl.cost.observe

    def spy(*args, **kwargs):
        row_s.append(ctl.cost._rows.row_s)
        observe(*args, **kwargs)
    ctl.cost.observe = spy
    eng.run(reqs)
    track, log = np.array(ctl.cost_track), eng.stats.step_log
    # a row's price x the step's batch where the step proposed (a draft pass in the log), else 0
    want = [row_s[i] * B if passes > 0 else 0.0 for i, (_, _, _, _, passes, B, _) in enumerate(log) if i > 0]
    assert track[:, 1].tolist() == want and sum(w > 0 for w in want) > len(want) / 2


class CostRecorder(DepthPolicy):
    """static k = 2 that records the cost it is shown at plan and at verify, and cost_learns."""
    name = "cost-recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, object, bool]] = []  # (step, batch, cost, cost_learns) at plan
        self.verify_costs: dict[int, object] = {}

    def plan(self, ctx):
        self.seen.append((ctx.step, ctx.batch_size, ctx.cost, ctx.cost_learns))
        return np.full(ctx.batch_size, 2)

    def verify(self, ctx):
        self.verify_costs[ctx.step] = ctx.cost
        return ctx.drafted


@pytest.mark.parametrize("learn", [True, False])
def test_policies_see_the_cost_priced_at_the_step_s_batch(pair, workload, learn):
    """With a model that prices step shapes (a profiled decode table), each step's policy calls
    see one view of it bound to that step's batch size; `cost_learns` says whether the
    controller refines the model (never in a replay)."""
    from tests.adaptive.cost.test_model import make_profiled
    base = make_profiled()
    cost = make_profiled(decode_s=base.target_table[:, [0, 3, 6]] * 0.8)
    policy = CostRecorder()
    eng = Engine(PairRunner(pair[0], pair[1], n_slots=4, max_depth=8),
                 Controller(policy, max_depth=8, cost=cost, learn_cost=learn))
    eng.run(workload[0])
    assert len(policy.seen) == eng.stats.steps
    for step, B, view, learns in policy.seen:
        assert learns is learn
        assert view is policy.verify_costs[step]  # one object for the step's calls
        assert view.target_time(B + 3, 500) == cost.target_time(B + 3, 500, B) != cost.target_time(B + 3, 500)
    plain = CostRecorder()
    Engine(PairRunner(pair[0], pair[1], n_slots=4, max_depth=8), Controller(plain, max_depth=8, cost=base)).run(workload[0])
    assert all(view is base for _, _, view, _ in plain.seen)  # no decode table: the model itself


class CountingAcceptance(AcceptanceModel):
    """The acceptance model, counting `prior_conf` calls (the model itself is unchanged)."""

    def __init__(self) -> None:
        super().__init__()
        self.prior_calls = 0

    def prior_conf(self, seq_ids, K):
        self.prior_calls += 1
        return super().prior_conf(seq_ids, K)


class PriorReader(DepthPolicy):
    """Budget 2; reads `prior_conf` in plan (`at="plan"`, keeping the context) or first in observe."""
    name = "prior-reader"

    def __init__(self, at: str) -> None:
        self.at, self.read, self.kept = at, [], None

    def plan(self, ctx):
        if self.at == "plan":
            self.read.append(ctx.prior_conf.copy())
        self.kept = ctx
        return np.full(ctx.batch_size, 2)

    def observe(self, out):
        self.read.append(self.kept.prior_conf)  # `at="plan"`: what plan read; else a first read, too late


def test_planning_priors_are_computed_only_for_a_policy_that_reads_them(pair, workload):
    """`PlanContext.prior_conf` is computed on first read: a static depth never pays for it; a
    policy that reads it in plan gets the acceptance model's priors as of the plan, and the same
    array on every later read; a first read after the controller learned from the step raises
    (counted, the step's outcome kept), as does one of a context pickled after it (a Ray replica)."""
    reqs, want = workload
    for spec, calls in (("static:k=2", 0), ("off", 0)):
        acc = CountingAcceptance()
        eng = Engine(PairRunner(pair[0], pair[1], n_slots=4, max_depth=8), Controller(make_policy(spec), 8, acceptance=acc))
        assert [o.output_ids for o in eng.run(reqs)] == want
        assert acc.prior_calls == calls and eng.stats.steps > 0
    acc, policy = CountingAcceptance(), PriorReader("plan")
    eng = Engine(PairRunner(pair[0], pair[1], n_slots=4, max_depth=8), Controller(policy, 8, acceptance=acc))
    assert [o.output_ids for o in eng.run(reqs)] == want
    assert acc.prior_calls == eng.stats.steps and len(policy.read) == 2 * eng.stats.steps
    for at_plan, at_observe in zip(policy.read[0::2], policy.read[1::2]):
        assert at_plan.shape == (at_plan.shape[0], 8) and np.array_equal(at_plan, at_observe)
    late = PriorReader("observe")
    ctl = Controller(late, 8)
    eng = Engine(PairRunner(pair[0], pair[1], n_slots=4, max_depth=8), ctl)
    assert [o.output_ids for o in eng.run(reqs)] == want
    assert ctl.fallbacks["observe: raised RuntimeError"] == eng.stats.steps and late.read == []
    # pickled: an open step's priors travel as the array; a closed one's stay closed
    fresh = Controller(PriorReader("none"), 8)
    ctx_ids, lens = np.array([3, 4], np.int64), np.array([10, 12], np.int64)
    fresh.plan(0, ctx_ids, lens)
    ctx = fresh.policy.kept
    copy = pickle.loads(pickle.dumps(ctx))
    assert isinstance(copy.priors, np.ndarray) and np.array_equal(copy.prior_conf, fresh.acceptance.prior_conf(ctx_ids, 8))
    fresh.plan(1, ctx_ids, lens)  # the next step closes the first
    with pytest.raises(RuntimeError, match="first read after"):
        pickle.loads(pickle.dumps(ctx)).prior_conf


class CheckedAcceptance(AcceptanceModel):
    """The acceptance model, counting `calibrate` calls; at each `observe` it checks the confidences
    the controller hands it against a fresh calibration of the step's features (the model has not
    changed since the step's calls: it learns here)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.checked = 0, 0

    def calibrate(self, seq_ids, top1, entropy):
        self.calls += 1
        return super().calibrate(seq_ids, top1, entropy)

    def observe(self, seq_ids, top1, entropy, verified, accepted, conf=None):
        if conf is not None:
            assert np.array_equal(conf, super().calibrate(seq_ids, top1, entropy) * (top1 > 0))
            self.checked += 1
        return super().observe(seq_ids, top1, entropy, verified, accepted, conf=conf)


def test_verify_reuses_the_last_keep_drafting_calibration_bit_for_bit(pair, workload):
    """Where drafting ended right after a `keep_drafting` call, the step's verify takes that call's
    confidences (padded) instead of calibrating again: the same numbers, one call fewer."""
    reqs, want = workload
    acc = CheckedAcceptance()
    ctl = Controller(RandomPolicy(seed=4), 8, acceptance=acc)
    eng = Engine(PairRunner(pair[0], pair[1], n_slots=4, max_depth=8), ctl)
    asks = []
    keep_fn = ctl.keep_fn

    def counting_keep_fn(step, seq_ids, budgets):
        fn = keep_fn(step, seq_ids, budgets)
        if fn is None:
            return None

        def keep(*a):
            asks.append(step)
            return fn(*a)
        return keep
    ctl.keep_fn = counting_keep_fn
    assert [o.output_ids for o in eng.run(reqs)] == want
    assert acc.checked == eng.stats.steps and len(set(asks)) > 5
    assert acc.calls < len(asks) + eng.stats.steps  # some verify calibrations were reused


@pytest.mark.parametrize("spec", ["dspark", "turbospec", "vllm-adaptive", "sglang-adaptive", "specdec++"])
def test_max_depth_0_runs_as_no_speculation_without_asking_the_policy(pair, workload, spec):
    """K = 0 (`--max-depth 0`) leaves nothing to decide: plain decoding, no fallback, no fault
    (dspark used to index an empty table every step)."""
    reqs, ref = workload
    ctl = Controller(make_policy(spec), max_depth=0)
    eng = Engine(PairRunner(pair[0], pair[1], n_slots=4, max_depth=0), ctl)
    assert [o.output_ids for o in eng.run(reqs)] == ref
    assert not ctl.fallbacks and eng.stats.pos_verified.sum() == 0


class ClosingSeen(DepthPolicy):
    """Drafts 2 everywhere and keeps what each plan was told of the run's end."""
    name = "closing-seen"

    def __init__(self) -> None:
        self.seen: list[tuple[int, object]] = []  # (batch size, PlanContext.closing)

    def plan(self, ctx):
        self.seen.append((ctx.batch_size, None if ctx.closing is None else ctx.closing.tolist()))
        return np.full(ctx.batch_size, 2)


def test_a_run_is_closing_once_no_request_waits_and_a_step_loop_never_is(pair):
    reqs = [Request(f"c{i}", [1 + i, 2, 3], n, ignore_eos=True) for i, n in enumerate([6, 9, 5])]
    policy = ClosingSeen()
    outs, _, eng = run(pair, reqs, policy, max_batch=2)
    assert [len(o.output_ids) for o in outs] == [6, 9, 5] and eng.closed is False
    first_closing = next(i for i, (_, c) in enumerate(policy.seen) if c is not None)
    assert all(c is None for _, c in policy.seen[:first_closing])  # the third request waited until then
    for b, c in policy.seen[first_closing:]:
        assert len(c) == b and all(1 <= x <= 9 for x in c)  # tokens each running request may still emit
    assert 5 in policy.seen[first_closing][1]  # the last admitted: all its tokens still to come
    served = ClosingSeen()  # a server's step loop: more may come at any step, so never closing
    eng = Engine(PairRunner(pair[0], pair[1], n_slots=2, max_depth=8), Controller(served, max_depth=8))
    eng.submit(Request("s", [1, 2, 3], 6, ignore_eos=True))
    while eng.has_work():
        eng.step()
    assert served.seen and all(c is None for _, c in served.seen)
