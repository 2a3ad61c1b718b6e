"""`specdepth export --hf`: the bundled pair as HF folders that transformers runs and specdepth reloads."""

from __future__ import annotations

import json

import pytest
import torch

from specdepth.experiments.cli.main import main
from specdepth.workers.bundled import heldout_prompts, load_pair
from specdepth.workers.hf_loader import load_hf_model, load_hf_tokenizer
from tests.workers.test_lossless_greedy import reference_greedy


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    for which in ("target", "draft"):
        assert main(["export", "--hf", str(root / which), "--model", f"bundled-{which}"]) == 0
    return root, load_pair(device="cpu")


def test_transformers_greedy_on_the_export_equals_specdepths(exported):
    transformers = pytest.importorskip("transformers")
    root, pair = exported
    hf = transformers.AutoModelForCausalLM.from_pretrained(root / "target", dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(root / "target")
    for prompt in heldout_prompts(3):
        ids = pair.tokenizer.encode(prompt)
        assert tok.encode(prompt) == ids
        out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                          pad_token_id=pair.eos_ids[0])[0, len(ids):].tolist()
        assert out == reference_greedy(pair.target, ids, 24)


def test_reloading_the_export_gives_identical_logits_and_the_same_tokenizer(exported):
    root, pair = exported
    x = torch.tensor([pair.tokenizer.encode(heldout_prompts(1)[0])])
    for which, model in (("target", pair.target), ("draft", pair.draft)):
        again = load_hf_model(root / which)
        assert again.cfg.vocab_size == model.cfg.vocab_size and again.cfg.n_layers == model.cfg.n_layers
        with torch.no_grad():
            assert torch.equal(again.forward_train(x), model.forward_train(x)), which
    assert load_hf_tokenizer(root / "target").eos_ids == pair.eos_ids
    config = json.loads((root / "target" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True


def test_export_refuses_what_it_cannot_write(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SystemExit):
        main(["export", "--hf", str(f)])
    assert "exists and is not a folder" in capsys.readouterr().err
