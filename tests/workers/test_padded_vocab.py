"""A pair of one tokenizer whose checkpoints pad their embeddings to different row counts (as
Qwen2.5-0.5B's 151,936 rows against 7B's 152,064): accepted, run on the shared ids, and
token-identical to transformers' greedy output; tokenizers that differ are refused."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from specdepth.adaptive.controller import Controller
from specdepth.adaptive.engine import Engine, Request
from specdepth.policies.registry import make_policy
from specdepth.workers.bundled import load_pair
from specdepth.workers.runner import PairRunner
from tests.workers.hf_fixtures import EOS_ID, VOCAB, make_hf_pair, save_checkpoint
from tests.workers.test_hf_loader import write_tokenizer

WORDS = [f"w{i}" for i in range(VOCAB)]


def padded(model, rows: int):
    """A copy of `model` whose embeddings and LM head are padded (or cut) to `rows` rows."""
    m = copy.deepcopy(model)
    m.resize_token_embeddings(rows)
    return m.eval()


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("padded")
    base = make_hf_pair(root / "base")
    target = padded(base.target, VOCAB + 32)  # the target pads its rows, the draft does not
    save_checkpoint(target, root / "target")
    save_checkpoint(base.draft, root / "draft")
    for d in ("target", "draft"):
        write_tokenizer(root / d, WORDS)
    return root, target


def test_a_padded_target_runs_and_equals_transformers_greedy(pairs):
    root, hf_target = pairs
    pair = load_pair(str(root / "target"), str(root / "draft"), device="cpu")
    assert pair.target.cfg.vocab_size == VOCAB + 32 and pair.draft.cfg.vocab_size == VOCAB
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, VOCAB, int(rng.integers(2, 10))).tolist() for _ in range(4)]
    for spec in ("static:k=4", "dspark"):
        eng = Engine(PairRunner(pair.target, pair.draft, n_slots=4, max_depth=6), Controller(make_policy(spec), 6),
                     eos_ids=(EOS_ID,))
        outs = eng.run([Request(str(i), p, 16) for i, p in enumerate(prompts)])
        assert eng.stats.pos_accepted.sum() > 0  # the draft's proposals were accepted: it ran
        for p, o in zip(prompts, outs):
            with torch.no_grad():
                ref = hf_target.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False,
                                         eos_token_id=EOS_ID, pad_token_id=0)[0, len(p):].tolist()
            assert o.output_ids == ref, spec


def test_a_draft_with_more_rows_proposes_only_the_targets_ids(pairs):
    root, _ = pairs
    pair = load_pair(str(root / "target"), str(root / "draft"), device="cpu")
    runner = PairRunner(pair.draft, pair.target, n_slots=2, max_depth=4)  # roles swapped: the draft is wider
    assert runner.shared_vocab == VOCAB
    slots = np.array(runner.add_many([[3, 4, 5], [7, 8]]))
    for _ in range(4):
        res = runner.step(slots, np.array([4, 4]))
        assert (runner.last_draft_tokens < VOCAB).all()
        assert all(t < VOCAB + 32 for e in res.emitted for t in e)


def test_tokenizers_that_differ_are_refused(pairs, tmp_path):
    root, _ = pairs
    other = tmp_path / "other"
    other.mkdir()
    for f in (root / "draft").iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    write_tokenizer(other, WORDS[:3] + [WORDS[4], WORDS[3]] + WORDS[5:])  # two ids swapped, same size
    with pytest.raises(ValueError, match="tokenizers differ in their model"):
        load_pair(str(root / "target"), str(other), device="cpu")
    assert json.loads((other / "tokenizer.json").read_text())["model"] != \
        json.loads((root / "target" / "tokenizer.json").read_text())["model"]
