"""Per-row sampling is lossless per row: one batch of greedy, T=0.7, T=1.0/top_p=0.9 and seeded rows.

Each row's first and third generated tokens are compared, by chi-square, with the target's own
distribution at that row's settings (enumerated exactly on an 8-token vocabulary), for the
draft model (sampled q) and suffix drafts (one-hot q). The leaking rule of
test_lossless_sampling.py, run on the same mixed batch, is caught. Seeded rows repeat their
output whatever else shares the batch and whatever depth drafts.
"""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.workers.runner import PairRunner
from specdepth.workers.sampler import SamplingParams
from tests.pairs import tiny_pair
from tests.workers.test_lossless_sampling import LATER, PROMPTS, exact_marginals, p_values

N_PER_GROUP = 4000
GROUPS = {"greedy": SamplingParams(0.0), "t0.7": SamplingParams(0.7), "t1-p0.9": SamplingParams(1.0, top_p=0.9),
          "seeded-t0.8": SamplingParams(0.8, seed=0)}


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=8, dim=32, noise=1.0, sharpen=4.0, seed=7)  # sharp enough that temperature shows


def settings(name: str, i: int) -> SamplingParams:
    sp = GROUPS[name]
    return SamplingParams(sp.temperature, sp.top_p, seed=1000 + i) if sp.seed is not None else sp


def mixed_samples(target, draft, drafter: str, prompt: list[int], depth: int, leak: bool, seed: int,
                  batch: int = 2000) -> dict[str, np.ndarray]:
    """(N_PER_GROUP, LATER) tokens per group, every group's rows interleaved in each batch."""
    names = list(GROUPS)
    runner = PairRunner(target, draft, n_slots=batch, max_depth=depth, seed=seed, buckets=((batch,), (1, 5)),
                        drafter=drafter)
    out = {n: [] for n in names}
    rng = np.random.default_rng(seed)

    def leaking_verify(top1, ent, drafted):  # verify x_1 only after seeing it is token 0: NOT lossless
        return np.where(runner.last_draft_tokens[:, 0] == 0, 1, 0)

    done = 0
    while done < N_PER_GROUP * len(names):
        kinds = [names[(done + i) % len(names)] for i in range(batch)]
        slots = np.array(runner.add_many([prompt] * batch, [settings(k, done + i) for i, k in enumerate(kinds)]))
        while min(len(runner.seqs[s]) for s in slots) < len(prompt) + LATER:
            budgets = rng.integers(0, depth + 1, batch) if not leak else np.full(batch, depth)
            runner.step(slots, budgets, verify_fn=leaking_verify if leak else None)
        for k, s in zip(kinds, slots):
            out[k].append(runner.seqs[s][len(prompt): len(prompt) + LATER])
            runner.remove(int(s))
        done += batch
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("drafter", ["model", "suffix"])
def test_each_row_of_a_mixed_batch_samples_the_target_at_its_own_settings(pair, drafter):
    target, draft = pair
    prompt = PROMPTS[drafter]
    got = mixed_samples(target, draft, drafter, prompt, depth=3, leak=False, seed=21)
    greedy = got.pop("greedy")
    first, later = exact_marginals(target, SamplingParams(0.0), prompt)
    assert (greedy[:, 0] == first.argmax()).all() and len({tuple(r) for r in greedy}) == 1
    for name, samples in got.items():
        sp = GROUPS[name]
        first, later = exact_marginals(target, SamplingParams(sp.temperature, sp.top_p), prompt)
        p1, p3 = p_values(samples, first, later)
        print(f"\n{drafter} {name}: p(first) = {p1:.3g}, p(position {LATER}) = {p3:.3g}")
        assert p1 >= 0.01 and p3 >= 0.01, name


def test_negative_control_the_leaking_rule_is_caught_in_a_mixed_batch(pair):
    target, draft = pair
    got = mixed_samples(target, draft, "model", PROMPTS["model"], depth=1, leak=True, seed=22)
    first, later = exact_marginals(target, SamplingParams(0.7), PROMPTS["model"])
    p1, _ = p_values(got["t0.7"], first, later)
    print(f"\nleaking rule, T=0.7 rows: p(first) = {p1:.3g}")
    assert p1 < 1e-6


@pytest.mark.parametrize("drafter", ["model", "suffix"])
def test_a_seeded_row_repeats_whatever_shares_its_batch_and_however_deep_it_drafts(pair, drafter):
    target, draft = pair
    prompt = [3, 1, 4, 1, 5, 1]
    mine = SamplingParams(0.9, top_p=0.95, seed=12345)
    outs = []
    for trial, (others, depth) in enumerate([(0, 0), (5, 3), (12, 6)]):
        runner = PairRunner(target, draft, n_slots=others + 1, max_depth=6, seed=trial, drafter=drafter)
        rng = np.random.default_rng(trial)
        crowd = [SamplingParams(float(rng.choice([0.0, 0.7, 1.0]))) for _ in range(others)]
        slots = np.array(runner.add_many([prompt] * (others + 1), [mine] + crowd))
        while len(runner.seqs[int(slots[0])]) < len(prompt) + 24:
            runner.step(slots, np.full(len(slots), depth))
        outs.append(runner.seqs[int(slots[0])][len(prompt): len(prompt) + 24])
    assert outs[0] == outs[1] == outs[2]
    other = PairRunner(target, draft, n_slots=1, max_depth=6, drafter=drafter)
    s = other.add_many([prompt], [SamplingParams(0.9, top_p=0.95, seed=54321)])[0]
    while len(other.seqs[s]) < len(prompt) + 24:
        other.step(np.array([s]), np.array([2]))
    assert other.seqs[s][len(prompt): len(prompt) + 24] != outs[0]  # another seed, another sample
