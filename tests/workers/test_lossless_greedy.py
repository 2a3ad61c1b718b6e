"""Greedy losslessness: speculative output == the target's own greedy decoding, token for token.

200 random prompts of mixed lengths and budgets join and leave a 16-slot batch; every sequence
gets a random depth in [0, 8] every step. The reference decodes each prompt alone with a full
causal forward (no cache), so it shares no code with the cached, ragged, rolled-back path.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdepth.adaptive.engine import Engine, Request
from tests.pairs import tiny_pair
from specdepth.workers.runner import PairRunner


def skip_compiled_hybrid(compile: str, drafter: str) -> None:
    if compile == "on" and drafter == "hybrid":  # CI time for no new code path
        pytest.skip("the hybrid's passes are the draft model's and the target's, run compiled by the model cases")


def reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model.forward_train(torch.tensor([seq], device=model.device))[0, -1].argmax()))
    return seq[len(prompt):]


# the compiled path (workers/compiled.py) at one bucket per model: every pass pads to it, so a
# couple of graphs are compiled per pair and the whole test runs through them
@pytest.mark.parametrize("drafter", ["model", "ngram", "suffix", "hybrid"])
@pytest.mark.parametrize("compile", ["off", "on"], ids=["eager", "compiled"])
def test_greedy_speculation_matches_target_only_decoding(compile, drafter):
    skip_compiled_hybrid(compile, drafter)
    target, draft = tiny_pair(noise=0.15)
    rng = np.random.default_rng(0)
    reqs = [Request(f"r{i}", rng.integers(0, 96, int(rng.integers(1, 24))).tolist(), int(rng.integers(1, 33)))
            for i in range(200)]
    engine = Engine(PairRunner(target, draft, n_slots=16, max_depth=8, compile=compile, buckets=((16,), (9,)),
                               drafter=drafter),
                    lambda ids, lens: rng.integers(0, 9, len(ids)))
    outs = engine.run(reqs)
    st = engine.stats
    rate = st.pos_accepted.sum() / st.pos_verified.sum()
    print(f"\nacceptance rate {rate:.3f}; per position "
          f"{np.round(st.pos_accepted / np.maximum(st.pos_verified, 1), 2).tolist()}; "
          f"verified per position {st.pos_verified.tolist()}; acceptance length {st.acceptance_length:.2f}")
    # acceptance must be non-trivial at every position: accepts and rejections both occur
    if drafter == "hybrid":  # suffix drafts where a suffix repeats, the model elsewhere: every position drafted
        assert (st.pos_accepted > 0).all() and st.pos_accepted[0] < st.pos_verified[0]
    elif drafter == "model":
        assert (st.pos_accepted > 0).all() and (st.pos_accepted < st.pos_verified).all()
        assert 0.2 < rate < 0.95
    else:  # a model-free drafter drafts where a suffix repeats: deep drafts accepted, rejections
        # at the first position (this pair's next token hangs mostly on the last one, so a draft
        # that starts right stays right)
        assert st.pos_accepted[:6].all() and st.pos_accepted[0] < st.pos_verified[0]
    for req, out in zip(reqs, outs):
        assert out.error is None
        assert out.output_ids == reference_greedy(target, req.prompt_ids, req.max_new_tokens), req.request_id


@pytest.mark.parametrize("drafter", ["model", "ngram", "suffix", "hybrid"])
@pytest.mark.parametrize("compile", ["off", "on"], ids=["eager", "compiled"])
def test_off_and_static_agree_exactly(compile, drafter):
    skip_compiled_hybrid(compile, drafter)
    target, draft = tiny_pair(noise=0.15, seed=3)
    rng = np.random.default_rng(1)
    reqs = [Request(f"r{i}", rng.integers(0, 96, int(rng.integers(1, 10))).tolist(), 20) for i in range(12)]
    outs = {}
    for k in (0, 1, 4, 8):
        eng = Engine(PairRunner(target, draft, n_slots=5, max_depth=8, compile=compile, buckets=((5,), (9,)),
                                drafter=drafter), lambda ids, lens, k=k: np.full(len(ids), k))
        outs[k] = [o.output_ids for o in eng.run(reqs)]
    assert outs[0] == outs[1] == outs[4] == outs[8]
