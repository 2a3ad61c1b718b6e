"""Speculative generation with two Hugging Face checkpoints (a Llama draft, a sharded Qwen2 target,
one vocabulary) is token-identical to the target's own greedy decoding and to `transformers`'
greedy `generate`."""

from __future__ import annotations

import numpy as np
import torch

from specdepth.adaptive.controller import Controller
from specdepth.adaptive.engine import Engine, Request
from specdepth.policies.registry import make_policy
from tests.workers.hf_fixtures import EOS_ID, make_hf_pair
from specdepth.workers.hf_loader import load_hf_model
from specdepth.workers.runner import PairRunner


def test_speculative_generation_matches_target_and_transformers(tmp_path):
    pair = make_hf_pair(tmp_path)
    target, draft = load_hf_model(pair.target_path), load_hf_model(pair.draft_path)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 96, int(rng.integers(2, 12))).tolist() for _ in range(8)]
    new = 24
    outs = {}
    for spec in ("off", "static:k=4", "dspark"):
        eng = Engine(PairRunner(target, draft, n_slots=4, max_depth=8), Controller(make_policy(spec), 8),
                     eos_ids=(EOS_ID,))
        res = eng.run([Request(str(i), p, new) for i, p in enumerate(prompts)])
        outs[spec] = [o.output_ids for o in res]
        if spec == "static:k=4":
            rate = eng.stats.pos_accepted.sum() / eng.stats.pos_verified.sum()
            assert 0.1 < rate < 0.99, rate  # partial acceptance: the check is not trivial
    assert outs["off"] == outs["static:k=4"] == outs["dspark"]
    for p, got in zip(prompts, outs["off"]):
        with torch.no_grad():
            ref = pair.target.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False,
                                       eos_token_id=EOS_ID, pad_token_id=0)[0, len(p):].tolist()
        assert got == ref
