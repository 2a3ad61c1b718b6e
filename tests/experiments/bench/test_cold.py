"""experiments/bench/cold.py: its variant sets, its one-line refusals, and its pairing of ratios
within a round (the runs themselves are fresh `specdepth generate` processes, minutes each)."""

from __future__ import annotations

import pytest

import specdepth.experiments.bench.cold as cold
from specdepth.experiments.bench.cold import DEFAULT_VARIANTS, MORE_VARIANTS, main, summarise, variant_list


def test_the_default_set_holds_what_the_goal_compares_and_all_adds_the_other_drafters() -> None:
    assert DEFAULT_VARIANTS[0] == "off" and {"static:k=1", "dspark", "dspark@suffix"} <= set(DEFAULT_VARIANTS)
    assert not set(DEFAULT_VARIANTS) & set(MORE_VARIANTS)
    assert variant_list(None, False) == list(DEFAULT_VARIANTS)
    assert variant_list(None, True) == [*DEFAULT_VARIANTS, *MORE_VARIANTS]
    assert variant_list(["dspark@ngram", "off", "dspark@ngram"], False) == ["off", "dspark@ngram"]  # off first, once


@pytest.mark.parametrize("argv, says", [(["--all", "--variant", "dspark"], "--all and --variant"),
                                        (["--kinds", "code,poetry"], "unknown kind 'poetry'"),
                                        (["--rounds", "0"], "--rounds")])
def test_a_bad_invocation_is_refused_in_one_line_before_any_run(argv, says, capsys, monkeypatch) -> None:
    def no_run(*args, **kwargs):
        raise AssertionError("a run started")
    monkeypatch.setattr(cold, "run_generate", no_run)  # a regression fails here, not minutes later
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and "Traceback" not in "\n".join(err)


def test_ratios_are_paired_within_a_round_then_the_median_taken() -> None:
    def run(rnd: int, variant: str, tps: float) -> dict:
        return {"round": rnd, "kind": "code", "batch": 1, "variant": variant, "tps": tps, "acc": 1.0,
                "cost_err": None, "tokens": 96, **{f"{k}_s": 0.1 for k in
                                                   ("prefill", "draft", "target", "sample", "commit", "control", "rest")}}
    # round 0 is fast for both, round 1 slow for both, round 2 dspark's bad one
    runs = [run(0, "off", 200), run(0, "dspark", 220), run(1, "off", 100), run(1, "dspark", 110),
            run(2, "off", 150), run(2, "dspark", 135)]
    rows, _ = summarise(runs, ["off", "dspark"])
    d = next(r for r in rows if r["variant"] == "dspark")
    assert d["ratio"] == pytest.approx(1.1) and (d["ratio_lo"], d["ratio_hi"]) == pytest.approx((0.9, 1.1))
    assert d["tps"] == 135.0 and d["rounds"] == 3  # the median of the tokens/s themselves, unpaired
