"""`specdepth` on bad input, case by case: the exit status, and one error line that names the flag.

A flag refused at parse time gets argparse's usage lines and then its one `error: argument --flag:`
line (exit 2); a failure found while running gets exactly one line `specdepth CMD: error: ...`
(exit 2 for bad input, 1 for the rest); an internal error names its exception and the --debug hint.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdepth.experiments.cli import policies as cmd_policies
from specdepth.experiments.cli.main import DEBUG_HINT, error_line, main
from specdepth.experiments.cli.synth import synth_traces
from specdepth.workers.bundled import BUNDLED_DIR

SAFETENSORS = BUNDLED_DIR / "target.safetensors"  # a real file of the wrong kind for traces and costs


def specdepth(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `specdepth argv...`, in process."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error:" in line]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    (d / "random.bin").write_bytes(os.urandom(4096))
    (d / "empty.jsonl").write_text("")
    (d / "folder").mkdir()
    trace = d / "t.jsonl"
    synth_traces(4, 16, seed=0, alpha=0.7, k_max=4).save(trace)
    (d / "bad_line.jsonl").write_text(trace.read_text().splitlines()[0] + "\n{\"id\": 1}\n")
    (d / "arrivals.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    return {"random": d / "random.bin", "empty": d / "empty.jsonl", "folder": d / "folder", "trace": trace,
            "bad_line": d / "bad_line.jsonl", "arrivals": d / "arrivals.csv", "dir": d}


def replay_args(files, **over: str) -> list[str]:
    args = {"--trace": str(files["trace"]), "--policy": "off", "--concurrency": "1", **over}
    return ["replay", "--no-progress", *[x for kv in args.items() for x in kv]]


# (flag, bad value): refused at parse time, exit 2, the last line names the flag
PARSE_CASES = [
    ("--concurrency", "0"), ("--concurrency", "abc"), ("--concurrency", "1,-4"), ("--concurrency", ""),
    ("--trace", "/nonexistent/t.jsonl"), ("--trace", "{random}"), ("--trace", "{empty}"), ("--trace", "{folder}"),
    ("--trace", str(SAFETENSORS)),
    ("--cost", "nosuch"), ("--cost", "fixed:target_ms=x"), ("--cost", "fixed:target_ms"),
    ("--cost", "fixed:target_ms=-1"), ("--cost", "h200:nosuch=1"), ("--cost", "{random}"), ("--cost", "{folder}"),
    ("--cost", str(SAFETENSORS)), ("--cost", "/nonexistent/cost.json"),
    ("--policy", "nosuch"), ("--policy", "static:k=-1"), ("--policy", "static:k=x"), ("--policy", "static:q=1"),
    ("--policy", "static:k"), ("--policy", "nosuch_module_xyz:Policy"), ("--policy", "os:path"),
    ("--max-batch", "0"), ("--requests", "-1"), ("--requests", "1e3"), ("--k-max", "-3"),
    ("--json", "{folder}"), ("--json", "{random}/out.jsonl"), ("--plot", "{dir}/plot.gif"),
]


@pytest.mark.parametrize("flag, value", PARSE_CASES)
def test_replay_refuses_a_bad_flag(files, capsys, flag, value):
    value = value.format(**files)
    rc, out, err = specdepth(capsys, *replay_args(files, **{flag: value}))
    lines = error_lines(err)
    assert rc == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"specdepth replay: error: argument {flag}") and err.rstrip().endswith(lines[0])


@pytest.mark.parametrize("flag, value", [
    ("--arrivals", "{folder}"), ("--arrivals", "{random}"), ("--arrivals", "{trace}"), ("--arrivals", "nosuch"),
    ("--rate-scale", "0"), ("--rate-scale", "nan"), ("--rate-scale", "inf"), ("--max-output", "0"), ("--seed", "-1"),
])
def test_replay_refuses_a_bad_arrival_flag(files, capsys, flag, value):
    argv = ["replay", "--no-progress", "--trace", str(files["trace"]), "--policy", "off", "--arrivals",
            str(files["arrivals"])]
    argv = [*argv, flag, value.format(**files)] if flag != "--arrivals" else [*argv[:-1], value.format(**files)]
    rc, out, err = specdepth(capsys, *argv)
    lines = error_lines(err)
    assert rc == 2 and len(lines) == 1 and f"argument {flag}" in lines[0], err


def test_a_trace_that_breaks_later_is_one_line_naming_file_and_line(files, capsys):
    rc, out, err = specdepth(capsys, *replay_args(files, **{"--trace": str(files["bad_line"])}))
    assert rc == 2 and out == ""
    assert err.strip() == err.strip().splitlines()[0]  # one line
    assert err.startswith(f"specdepth replay: error: {files['bad_line']}:2: ")


@pytest.mark.parametrize("argv, flag", [
    (["--requests", "0"], "--requests"), (["--tokens", "-1"], "--tokens"), (["--tokens", "x"], "--tokens"),
    (["--alpha", "2"], "--alpha"), (["--alpha", "nan"], "--alpha"), (["--curve", "0.5,x"], "--curve"),
    (["--curve", "0.5,1.5"], "--curve"), (["--k-max", "0"], "--k-max"), (["--k-max", "65"], "--k-max"),
    (["--concentration", "0"], "--concentration"), (["--noise", "-1"], "--noise"),
    (["--temperature", "-0.5"], "--temperature"), (["--seed", "-1"], "--seed"), (["--prompt-len", "-1"], "--prompt-len"),
])
def test_synth_refuses_bad_sizes(files, capsys, argv, flag):
    base = {"--out": str(files["dir"] / "s.jsonl"), "--requests": "2", "--tokens": "4", "--alpha": "0.5"}
    if flag == "--curve":
        del base["--alpha"]
    base.update(dict(zip(argv[::2], argv[1::2])))
    rc, out, err = specdepth(capsys, "synth", *[x for kv in base.items() for x in kv])
    lines = error_lines(err)
    assert rc == 2 and len(lines) == 1 and f"argument {flag}" in lines[0], err


def test_synth_refuses_a_trace_too_large_in_one_line(files, capsys):
    rc, out, err = specdepth(capsys, "synth", "--out", files["dir"] / "big.jsonl", "--requests", "100000",
                             "--tokens", "100000", "--alpha", "0.5")
    assert rc == 2 and err.count("\n") == 1 and "--requests x --tokens x --k-max" in err


def test_synth_refuses_a_folder_as_out(files, capsys):
    rc, _, err = specdepth(capsys, "synth", "--out", files["folder"], "--requests", "2", "--tokens", "4",
                           "--alpha", "0.5")
    assert rc == 2 and "argument --out" in error_lines(err)[0]


@pytest.mark.parametrize("argv, flag", [
    (["--repeats", "0"], "--repeats"), (["--token-grid", "0,1"], "--token-grid"),
    (["--token-grid", "4,2"], "--token-grid"), (["--token-grid", "1,100000"], "--token-grid"),
    (["--ctx-grid", "-1"], "--ctx-grid"), (["--ctx-grid", "0,0"], "--ctx-grid"), (["--threads", "-1"], "--threads"),
    (["--device", "nosuch"], "--device"), (["--device", "cuda:99"], "--device"), (["--dtype", "int8"], "--dtype"),
    (["--plot", "p.txt"], "--plot"),
])
def test_profile_refuses_bad_sizes(files, capsys, argv, flag):
    rc, out, err = specdepth(capsys, "profile", "--out", files["dir"] / "p.json", *argv)
    lines = error_lines(err)
    assert rc == 2 and len(lines) == 1 and f"argument {flag}" in lines[0], err


@pytest.mark.parametrize("argv, flag", [
    (["--batch", "0"], "--batch"), (["--k-max", "0"], "--k-max"), (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--n", "-1"], "--n"), (["--prompts", "{folder}"], "--prompts"), (["--prompts", "/nonexistent"], "--prompts"),
    (["--target", "{random}", "--draft", "{random}"], "--target"), (["--target", "{folder}"], "--target"),
    (["--temperature", "nan"], "--temperature"), (["--threads", "100000"], "--threads"),
])
def test_record_refuses_bad_flags(files, capsys, argv, flag):
    argv = [a.format(**files) for a in argv]
    rc, out, err = specdepth(capsys, "record", "--out", files["dir"] / "r.jsonl", "--no-progress", *argv)
    lines = error_lines(err)
    assert rc == 2 and len(lines) == 1 and f"argument {flag}" in lines[0], err


def test_record_reports_unreadable_prompts_in_one_line(files, capsys):
    rc, out, err = specdepth(capsys, "record", "--out", files["dir"] / "r.jsonl", "--prompts", files["random"])
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"specdepth record: error: {files['random']}: ")


def test_tune_refuses_a_bad_concurrency(files, capsys):
    rc, _, err = specdepth(capsys, "tune", "--trace", files["trace"], "--concurrency", "0")
    assert rc == 2 and "argument --concurrency" in error_lines(err)[0]


def test_an_internal_error_is_one_line_with_the_debug_hint(monkeypatch, capsys):
    def boom(args):
        raise RuntimeError("something broke\ninside")
    monkeypatch.setattr(cmd_policies, "run", boom)
    rc, out, err = specdepth(capsys, "policies")
    assert rc == 1 and out == ""
    assert err == f"specdepth policies: error: internal error RuntimeError: something broke inside {DEBUG_HINT}\n"
    with pytest.raises(RuntimeError, match="something broke"):
        main(["--debug", "policies"])


def test_a_runtime_failure_is_one_line_exit_1(monkeypatch, capsys):
    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(cmd_policies, "run", full)
    rc, _, err = specdepth(capsys, "policies")
    assert rc == 1 and err == "specdepth policies: error: OSError: [Errno 28] No space left on device\n"


@pytest.mark.parametrize("debug", [False, True])
def test_debug_shows_the_traceback_only_when_asked(debug):
    code = ("import sys\nfrom specdepth.experiments.cli import main as cli, policies as cmd_policies\n"
            "def boom(args):\n    raise KeyError('x')\n"
            "cmd_policies.run = boom\n"
            f"sys.exit(cli.main({['--debug', 'policies'] if debug else ['policies']!r}))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    if debug:
        assert "Traceback (most recent call last)" in res.stderr and "KeyError: 'x'" in res.stderr
    else:
        assert res.stderr == f"specdepth policies: error: internal error KeyError: 'x' {DEBUG_HINT}\n"


def test_error_line_classes():
    from safetensors import SafetensorError
    assert error_line("x", ValueError("bad"))[1] == 2
    assert error_line("x", FileNotFoundError(2, "No such file", "f"))[1] == 2
    assert error_line("x", IsADirectoryError(21, "Is a directory", "d"))[1] == 2
    assert error_line("x", SafetensorError("header too large")) == ("specdepth x: error: header too large", 2)
    assert error_line("x", MemoryError())[1] == 1
    line, code = error_line(None, ZeroDivisionError("division by zero"))
    assert code == 1 and line.startswith("specdepth: error: internal error ZeroDivisionError") and DEBUG_HINT in line
