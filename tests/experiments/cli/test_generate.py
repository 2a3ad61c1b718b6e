"""`specdepth generate` end to end on the bundled pair, in-process: prompt files, aligned outputs,
--output, finish reasons in the summary, and flags refused up front with exit status 2."""

from __future__ import annotations

import json

import pytest

from specdepth.experiments.cli.main import main
from specdepth.workers.bundled import BUNDLED_DIR
from specdepth.workers.tokenizer import Tokenizer

QUICK = ["--cost", "fixed:target_ms=10,draft_ms=1", "--max-new-tokens", "4", "--device", "cpu"]


def generate(capsys, *argv: str) -> tuple[int, str, str]:
    """Runs `specdepth generate argv...`; returns (exit status, stdout, stderr)."""
    try:
        rc = main(["generate", *argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_multi_line_json_lines_prompts_give_objects_in_order(tmp_path, capsys):
    prompts = ["def add(a, b):\n    return a + b\n", "class Stack:\n    def __init__(self):\n",
               "import os\nimport sys\n\n\ndef main(argv):\n"]
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    dest = tmp_path / "out.jsonl"
    rc, out, err = generate(capsys, "--prompts", str(src), "--json", "--output", str(dest), *QUICK)
    assert rc == 0, err
    objs = [json.loads(line) for line in out.splitlines()]
    assert [o["prompt"] for o in objs] == prompts and [o["id"] for o in objs] == ["0", "1", "2"]
    assert all(o["error"] is None and len(o["token_ids"]) == 4 and o["finish_reason"] == "length" for o in objs)
    assert [json.loads(line) for line in dest.read_text(encoding="utf-8").splitlines()] == objs
    assert f"wrote 3 results to {dest}" in err
    assert "finished: 3 length, 0 eos, 0 context" in err


def test_malformed_line_names_file_and_line(tmp_path, capsys):
    src = tmp_path / "p.jsonl"
    src.write_text('{"prompt": "ok"}\n{"prompt": "broken\n', encoding="utf-8")
    rc, out, err = generate(capsys, "--prompts", str(src), *QUICK)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"specdepth generate: error: {src}:2: not JSON (")


def test_backslash_n_reaches_the_tokenizer_and_empty_line_keeps_its_place(tmp_path, capsys, monkeypatch):
    seen: list[str] = []
    encode = Tokenizer.encode

    def spy(self, text: str) -> list[int]:
        seen.append(text)
        return encode(self, text)

    monkeypatch.setattr(Tokenizer, "encode", spy)
    src = tmp_path / "p.txt"
    lines = ["print('a\\nb')", "", "def f(x):"]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rc, out, err = generate(capsys, "--prompts", str(src), "--json", *QUICK)
    assert rc == 1  # one request refused; the others ran
    assert seen == lines  # exactly as written: backslash and n, no newline
    objs = [json.loads(line) for line in out.splitlines()]
    assert [o["prompt"] for o in objs] == lines
    assert objs[1]["finish_reason"] == "error" and "empty prompt" in objs[1]["error"] and objs[1]["text"] == ""
    assert [o["finish_reason"] for o in (objs[0], objs[2])] == ["length", "length"]
    assert "1 error" in err and "empty prompt" in err

    rc, out, err = generate(capsys, "--prompts", str(src), *QUICK)  # text mode: an empty line in its place
    assert rc == 1
    assert out == f"{objs[0]['text']}\n\n{objs[2]['text']}\n"


def test_context_limit_and_too_long_prompt(tmp_path, capsys):
    tok = Tokenizer(BUNDLED_DIR / "tokenizer.json")
    near, over = " a" * 1020, " a" * 1030  # the bundled pair holds 1024 positions
    assert (len(tok.encode(near)), len(tok.encode(over))) == (1020, 1030)
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def f(x):", over, near]), encoding="utf-8")
    rc, out, err = generate(capsys, "--prompts", str(src), "--json", *QUICK[:2], "--max-new-tokens", "8",
                            "--device", "cpu")
    assert rc == 1
    objs = [json.loads(line) for line in out.splitlines()]
    assert [o["finish_reason"] for o in objs] == ["length", "error", "context"]
    assert "does not fit the context" in objs[1]["error"]
    assert len(objs[0]["token_ids"]) == 8 and 1 <= len(objs[2]["token_ids"]) <= 4
    assert "finished: 1 length, 0 eos, 1 context, 1 error" in err


BUNDLED_TARGET = str(BUNDLED_DIR / "target.safetensors")


@pytest.mark.parametrize("flags, names", [
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--max-batch", "0"], "--max-batch"),
    (["--max-batch", "-2"], "--max-batch"),
    (["--max-depth", "-1"], "--max-depth"),
    (["--max-depth", "65"], "--max-depth"),
    (["--temperature", "-0.5"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "inf"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--threads", "-1"], "--threads"),
    (["--replicas", "0"], "--replicas"),
    (["--seed", "-1"], "--seed"),
    (["--target", "/no/such/model.safetensors", "--draft", BUNDLED_TARGET], "--target"),
    (["--target", BUNDLED_TARGET], "--draft"),
    (["--draft", BUNDLED_TARGET], "--target"),
    (["--output", "/no/such/dir/out.jsonl"], "--output"),
    (["--cost", "warp9"], "cost"),
    (["--drafter", "eagle"], "--drafter"),
    (["--ngram-min", "0"], "--ngram-min"),
    (["--ngram-max", "0"], "--ngram-max"),
    (["--drafter", "ngram", "--ngram-min", "5", "--ngram-max", "3"], "--ngram-min"),
])
def test_bad_flag_exits_2_with_one_line_naming_it(tmp_path, capsys, flags, names):
    src = tmp_path / "p.txt"
    src.write_text("def f(x):\n", encoding="utf-8")
    rc, out, err = generate(capsys, "--prompts", str(src), *flags)
    assert rc == 2 and out == ""
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and names in errors[0], err


@pytest.mark.parametrize("make", [lambda d: d / "absent.txt", lambda d: d])
def test_prompts_must_be_a_readable_file(tmp_path, capsys, make):
    rc, out, err = generate(capsys, "--prompts", str(make(tmp_path)))
    errors = [line for line in err.splitlines() if "error:" in line]
    assert rc == 2 and len(errors) == 1 and "argument --prompts" in errors[0]


def test_ngram_drafter_gives_the_model_drafters_text_and_says_so(tmp_path, capsys):
    src = tmp_path / "p.txt"
    src.write_text("def f(x):\n    return x\ndef f(y):\nclass A:\n", encoding="utf-8")
    runs = {d: generate(capsys, "--prompts", str(src), "--drafter", d, *QUICK, "--max-new-tokens", "24")
            for d in ("model", "ngram")}
    assert runs["model"][0] == runs["ngram"][0] == 0
    assert runs["model"][1] == runs["ngram"][1] != ""  # greedy: the same text whatever drafts
    assert "drafter ngram" in runs["ngram"][2] and "drafter model" in runs["model"][2]


def test_a_policy_past_max_depth_is_refused_not_clamped(capsys):
    rc, out, err = generate(capsys, "--prompt", "def f(x):", "--policy", "static:k=20", "--max-depth", "8", *QUICK)
    assert rc == 2 and out == ""
    assert err.strip() == ("specdepth generate: error: policy static(k=20) asks for depth 20, past the largest "
                           "draft budget K=8 (--max-depth): lower it, or raise K")


NOISY = '''
import time

import numpy as np
from specdepth.policies.base import DepthPolicy

class Noisy(DepthPolicy):
    name, params = "noisy", {}

    def plan(self, ctx):
        print("a line a replica prints on its stdout", flush=True)
        if ctx.step == 0:  # Ray forwards workers' output from their log files a moment later, and
            time.sleep(1.0)  # drops what it has not forwarded when the driver shuts down
        return np.full(ctx.batch_size, 2)
'''


def test_ray_json_stdout_carries_results_only(tmp_path):
    """A replica's own stdout (here a policy's print) goes to stderr, never among the JSON results."""
    import os
    import subprocess
    import sys
    (tmp_path / "noisy.py").write_text(NOISY)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "RAY_DEDUP_LOGS": "0"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "specdepth.experiments.cli.main", "generate", "--ray", "--json",
                          "--prompts", str(_two_prompts(tmp_path)), "--policy", "noisy:Noisy", "--threads", "1",
                          *QUICK], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all(json.loads(line)["error"] is None for line in lines)
    assert "a line a replica prints" in out.stderr


def _two_prompts(tmp_path):
    path = tmp_path / "two.txt"
    path.write_text("def f(x):\nclass A:\n")
    return path


def test_json_lines_records_bring_their_own_sampling(tmp_path, capsys):
    """A seeded record repeats its output beside others in one batch; a record without settings
    runs at the flags (greedy: generate's plain output); a bad setting is named by file and line."""
    src = tmp_path / "p.jsonl"
    seeded = {"prompt": "def add(a, b):", "temperature": 0.9, "top_p": 0.95, "seed": 7}
    src.write_text("\n".join(json.dumps(r) for r in [seeded, {"prompt": "def add(a, b):"}, seeded,
                                                     {"prompt": "def add(a, b):", "temperature": 1.0}]) + "\n")
    flags = ["--cost", "fixed:target_ms=10,draft_ms=1", "--max-new-tokens", "16", "--device", "cpu", "--json"]
    rc, out, _ = generate(capsys, "--prompts", str(src), *flags)
    rows = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and rows[0]["token_ids"] == rows[2]["token_ids"]
    rc, out, _ = generate(capsys, "--prompt", "def add(a, b):", *flags)
    assert rows[1]["token_ids"] == json.loads(out)["token_ids"] != rows[0]["token_ids"]
    src.write_text('{"prompt": "x"}\n{"prompt": "x", "top_p": 0}\n')
    rc, _, err = generate(capsys, "--prompts", str(src), *flags)
    assert rc != 0 and f"{src}:2: need temperature >= 0, 0 < top_p <= 1" in err
    assert "compiled passes" not in err  # refused before any model loads
