"""`specdepth profile` end to end on a tiny random pair standing in for the bundled one."""

from __future__ import annotations

import argparse
import sys
import types

import torch

from specdepth.adaptive.cost.model import ProfiledCost, parse_cost
from specdepth.experiments.cli import profile as cmd_profile
from specdepth.workers.model import ModelConfig, Transformer


def test_profile_command_writes_json_and_plot(tmp_path, monkeypatch):
    cfg = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=512)
    pair = types.SimpleNamespace(target=Transformer(cfg), draft=Transformer(cfg), tokenizer=None)
    monkeypatch.setitem(sys.modules, "specdepth.workers.bundled", types.SimpleNamespace(load_pair=lambda: pair))
    parser = argparse.ArgumentParser()
    cmd_profile.register(parser.add_subparsers())
    args = parser.parse_args(["profile", "--out", str(tmp_path / "c.json"), "--plot", str(tmp_path / "c.png"),
                              "--quick", "--device", "cpu", "--threads", "1"])
    n_threads = torch.get_num_threads()
    try:
        assert args.func(args) == 0
    finally:
        torch.set_num_threads(n_threads)
    cost = parse_cost(str(tmp_path / "c.json"))
    assert isinstance(cost, ProfiledCost) and cost.target_time(8) > 0
    assert (tmp_path / "c.png").stat().st_size > 10_000
