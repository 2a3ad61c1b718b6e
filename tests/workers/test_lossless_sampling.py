"""Sampling losslessness: speculative sampling is distributed exactly as target-only sampling, at
the first and at a later generated position (chi-square against the exact target distribution,
computed by enumeration on an 8-token vocabulary), for every drafter: the draft model (a *sampled*
draft), n-gram lookup and suffix decoding (deterministic ones, their q one-hot). Negative controls, caught by the
same test: DESIGN.md's leaking rule (verify a sampled draft token only after seeing that it is
token 0), and a model-free drafter that reports a soft q for its deterministic proposal.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from tests.pairs import tiny_pair
from specdepth.adaptive.controller import StepRecord
from specdepth.workers.drafters.base import Proposal
from specdepth.workers.drafters.hybrid import HybridDrafter
from specdepth.workers.drafters.ngram import NgramDrafter
from specdepth.workers.runner import PairRunner
from specdepth.workers.sampler import SamplingParams, probs_from_logits
from tests.workers.test_lossless_greedy import skip_compiled_hybrid

V, N_SAMPLES, LATER = 8, 20_000, 3  # LATER: the 3rd generated token
# per drafter: the n-gram drafter needs a suffix that occurred before (1 -> 4 or 5) to draft at once
PROMPTS = {"model": [3, 1, 4], "ngram": [3, 1, 4, 1, 5, 1], "suffix": [3, 1, 4, 1, 5, 1], "hybrid": [3, 1, 4, 1, 5, 1]}
PROMPT = PROMPTS["model"]


class SoftQNgram(NgramDrafter):
    """NOT lossless: proposes what `NgramDrafter` proposes but reports q(x) = 0.5 for it (a
    frequency read as a distribution), so the sampler accepts x with min(1, p(x) / 0.5)."""

    def propose(self, seqs, slots, budgets, keep_fn):
        prop = super().propose(seqs, slots, budgets, keep_fn)
        B, J = prop.tokens.shape
        q = torch.full((B, J, V), 0.5 / (V - 1))
        q.scatter_(-1, prop.tokens[..., None], 0.5)
        return Proposal(prop.tokens, q, prop.drafted)


class ZeroQHybrid(HybridDrafter):
    """NOT lossless: a hybrid that leaves the model-free rows' q as the draft model left it (0, as
    it drafted nothing there), so the sampler accepts their tokens whatever p says."""

    def propose(self, *a, **k):
        prop = super().propose(*a, **k)
        if prop.qprobs is not None:
            prop.qprobs[torch.from_numpy(prop.free)] = 0.0
        return prop


def exact_marginals(target, sp: SamplingParams, prompt: list[int] = PROMPT) -> tuple[np.ndarray, np.ndarray]:
    """P(first token), P(token at position LATER) under target-only sampling, by enumeration."""
    def dist(seq):
        with torch.no_grad():
            return probs_from_logits(target.forward_train(torch.tensor([seq]))[0, -1], sp).double().numpy()
    first = dist(prompt)
    later = np.zeros(V)
    for path in itertools.product(range(V), repeat=LATER - 1):
        p_path = np.prod([dist(prompt + list(path[:i]))[path[i]] for i in range(len(path))])
        later += p_path * dist(prompt + list(path))
    return first, later


def speculative_samples(target, draft, sp, depth: int, leak: bool, seed: int, policy=None,
                        compile: str = "off", drafter="model", prompt: list[int] = PROMPT) -> np.ndarray:
    """(N_SAMPLES, LATER) tokens from speculative sampling.

    With `policy`, depths come from it through the real Controller (plan, early stop, causal verify).
    `compile`: the passes' path; compiled at one bucket (every pass padded to it), shared by the tests.
    `drafter`: a name or a `Drafter`.
    """
    batch = 2000
    runner = PairRunner(target, draft, n_slots=batch, max_depth=depth, sampling=sp, seed=seed, compile=compile,
                        buckets=((batch,), (1, 5)), drafter="hybrid" if drafter == "zero-q-hybrid" else drafter)
    if drafter == "zero-q-hybrid":
        runner.drafter = ZeroQHybrid(runner)
    hybrid = getattr(runner.drafter, "chooses", False)
    pick = np.random.default_rng(seed)  # without a policy, a hybrid's rows take either draft at random
    out, step = [], 0
    speculative_samples.accepted = 0  # draft tokens accepted in all: the drafter really drafted

    def leaking_verify(top1, ent, drafted):  # decides whether to verify x_1 after looking at it: NOT lossless
        return np.where(runner.last_draft_tokens[:, 0] == 0, 1, 0)

    for _ in range(N_SAMPLES // batch):
        slots = np.array(runner.add_many([prompt] * batch))
        while min(len(runner.seqs[s]) for s in slots) < len(prompt) + LATER:
            budgets = np.full(batch, depth)
            verify_fn = leaking_verify if leak else None
            if policy is not None:
                ids = slots.astype(np.int64)
                lens = np.array([len(runner.seqs[s]) for s in slots])
                budgets = policy.plan(step, ids, lens)
                choose = policy.choose_fn(step, ids, lens, budgets) if hybrid else None
                res = runner.step(slots, budgets, policy.keep_fn(step, ids, budgets), policy.verify_fn(step, ids, lens),
                                  choose, np.full(batch, depth) if hybrid else None)
                speculative_samples.accepted += int(res.accepted.sum())
                policy.observe(StepRecord(step, ids, lens, budgets, res, np.zeros(0, np.int64)))
                step += 1
                continue
            choose = (lambda t, e, d: pick.random(len(d)) < 0.5) if hybrid else None
            speculative_samples.accepted += int(runner.step(slots, budgets, verify_fn=verify_fn,
                                                            choose_fn=choose).accepted.sum())
        out.extend(runner.seqs[s][len(prompt): len(prompt) + LATER] for s in slots)
        for s in slots:
            runner.remove(int(s))
    return np.array(out)


def p_values(samples: np.ndarray, first: np.ndarray, later: np.ndarray) -> tuple[float, float]:
    res = []
    for col, exp in ((0, first), (LATER - 1, later)):
        obs = np.bincount(samples[:, col], minlength=V)
        keep = exp * len(samples) > 5  # chi-square needs expected counts > 5; pool the rest
        f_obs = np.append(obs[keep], obs[~keep].sum())
        f_exp = np.append(exp[keep], exp[~keep].sum()) * len(samples)
        if f_exp[-1] == 0:
            f_obs, f_exp = f_obs[:-1], f_exp[:-1]
        res.append(chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum()).pvalue)
    return res[0], res[1]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=V, dim=32, noise=1.0, sharpen=0.5, seed=7)


@pytest.mark.parametrize("drafter", ["model", "ngram", "suffix", "hybrid"])
@pytest.mark.parametrize("compile", ["off", "on"], ids=["eager", "compiled"])
@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.8, top_p=0.9)], ids=["t1", "t0.8-p0.9"])
def test_speculative_sampling_matches_target(pair, sp, compile, drafter):
    skip_compiled_hybrid(compile, drafter)
    target, draft = pair
    first, later = exact_marginals(target, sp, PROMPTS[drafter])
    samples = speculative_samples(target, draft, sp, depth=3, leak=False, seed=11, compile=compile,
                                  drafter=drafter, prompt=PROMPTS[drafter])
    p1, p3 = p_values(samples, first, later)
    print(f"\n{sp}: p(first) = {p1:.3g}, p(position {LATER}) = {p3:.3g}")
    assert p1 >= 0.01 and p3 >= 0.01 and speculative_samples.accepted > N_SAMPLES // 10


@pytest.mark.parametrize("compile", ["off", "on"], ids=["eager", "compiled"])
def test_negative_control_leaking_rule_is_caught(pair, compile):
    target, draft = pair
    sp = SamplingParams(1.0)
    first, later = exact_marginals(target, sp)
    samples = speculative_samples(target, draft, sp, depth=1, leak=True, seed=12, compile=compile)
    p1, _ = p_values(samples, first, later)
    print(f"\nleaking rule: p(first) = {p1:.3g}")
    assert p1 < 1e-6


@pytest.mark.parametrize("bad", ["soft-q-ngram", "zero-q-hybrid"])
@pytest.mark.parametrize("compile", ["off", "on"], ids=["eager", "compiled"])
def test_negative_control_a_wrong_q_for_a_deterministic_draft_is_caught(pair, compile, bad):
    """SoftQNgram reports q(x) = 0.5 for its deterministic proposal; ZeroQHybrid leaves its
    model-free rows' q at 0 beside the draft model's rows: both bias the output, and are caught."""
    skip_compiled_hybrid(compile, "hybrid" if bad == "zero-q-hybrid" else bad)
    target, draft = pair
    sp = SamplingParams(1.0)
    prompt = PROMPTS["ngram"]
    first, later = exact_marginals(target, sp, prompt)
    samples = speculative_samples(target, draft, sp, depth=3, leak=False, seed=12, compile=compile,
                                  drafter=SoftQNgram() if bad == "soft-q-ngram" else bad, prompt=prompt)
    p1, _ = p_values(samples, first, later)
    print(f"\n{bad}: p(first) = {p1:.3g}")
    assert p1 < 1e-6


@pytest.mark.parametrize("drafter", ["model", "ngram", "suffix", "hybrid"])
@pytest.mark.parametrize("compile", ["off", "on"], ids=["eager", "compiled"])
@pytest.mark.parametrize("spec", ["dspark", "random"])
def test_adaptive_policies_keep_sampling_lossless(pair, spec, compile, drafter):
    skip_compiled_hybrid(compile, drafter)
    from specdepth.adaptive.controller import Controller
    from specdepth.adaptive.cost.model import FixedCost
    from specdepth.policies.registry import make_policy
    from tests.adaptive.test_controller import RandomPolicy
    target, draft = pair
    sp = SamplingParams(1.0)
    from tests.workers.drafters.test_hybrid import RandomChooser
    policy = (RandomChooser(5) if drafter == "hybrid" else RandomPolicy(5)) if spec == "random" else make_policy(spec)
    ctl = Controller(policy, max_depth=4, cost=FixedCost(target_ms=10, draft_ms=1))
    if drafter in ("ngram", "suffix"):
        ctl.draft_is_free()
    elif drafter == "hybrid":
        ctl.drafts_hybrid()
    first, later = exact_marginals(target, sp, PROMPTS[drafter])
    samples = speculative_samples(target, draft, sp, depth=4, leak=False, seed=13, policy=ctl, compile=compile,
                                  drafter=drafter, prompt=PROMPTS[drafter])
    p1, p3 = p_values(samples, first, later)
    print(f"\n{spec}: p(first) = {p1:.3g}, p(position {LATER}) = {p3:.3g}")
    assert p1 >= 0.01 and p3 >= 0.01 and speculative_samples.accepted > 0
