"""Prompt files: plain text kept exactly as written, JSON lines, and `file:line` errors."""

from __future__ import annotations

import json

import pytest

from specdepth.experiments.cli.prompts import read_prompts


def test_plain_text_lines_exactly_as_written(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("print('a\\nb')\n\n  indented \\t tab\nlast", encoding="utf-8")
    assert read_prompts(f) == ["print('a\\nb')", "", "  indented \\t tab", "last"]


def test_plain_text_crlf_and_final_newline(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"one\r\ntwo\r\n")
    assert read_prompts(f) == ["one", "two"]


def test_plain_text_keeps_form_feed_and_unicode_separators_inside_a_line(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("a\x0cb\u2028c\nd\n", encoding="utf-8")
    assert read_prompts(f) == ["a\x0cb\u2028c", "d"]


def test_plain_text_line_starting_with_a_brace_is_not_json(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("{ not json\nsecond\n", encoding="utf-8")
    assert read_prompts(f) == ["{ not json", "second"]


@pytest.mark.parametrize("name", ["p.jsonl", "p.JSONL", "p.txt", "prompts"])
def test_json_lines_multi_line_prompts(tmp_path, name):
    prompts = ["def f(x):\n    return x\n", "class A:\n    pass", "plain \\n stays two characters"]
    f = tmp_path / name
    lines = [json.dumps({"prompt": p, "id": i}) for i, p in enumerate(prompts)]
    f.write_text("\n" + "\n".join(lines[:2]) + "\n   \n" + lines[2] + "\n", encoding="utf-8")
    assert read_prompts(f) == prompts


def test_json_lines_empty_prompt_is_kept(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{"prompt": ""}\n{"prompt": "b"}\n', encoding="utf-8")
    assert read_prompts(f) == ["a", "", "b"]


@pytest.mark.parametrize("bad, reason", [
    ('{"prompt": "unterminated', "not JSON"),
    ("just text", "not JSON"),
    ('["a", "b"]', "expected a JSON object"),
    ('"a string"', "expected a JSON object"),
    ('{"text": "a"}', 'no "prompt" key'),
    ('{"prompt": 7}', '"prompt" must be a string, got a JSON number'),
    ('{"prompt": null}', '"prompt" must be a string, got a JSON null'),
    ('{"prompt": [1, 2]}', '"prompt" must be a string, got a JSON array'),
    ('{"prompt": "\\ud800"}', "unpaired surrogate"),
])
def test_json_lines_bad_line_names_file_and_line(tmp_path, bad, reason):
    f = tmp_path / "p.jsonl"
    f.write_text(f'{{"prompt": "ok"}}\n\n{bad}\n{{"prompt": "after"}}\n', encoding="utf-8")
    with pytest.raises(ValueError) as e:
        read_prompts(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}:3: ") and reason in msg and "\n" not in msg


def test_detected_json_lines_bad_later_line(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text('{"prompt": "ok"}\nnot a record\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.txt:2: not JSON"):
        read_prompts(f)


def test_not_utf8_names_the_line(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(ValueError, match=r"p\.txt:2: not UTF-8"):
        read_prompts(f)


def test_utf8_bom_is_not_part_of_the_first_prompt(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"\xef\xbb\xbfhello\n")
    assert read_prompts(f) == ["hello"]


@pytest.mark.parametrize("name, text", [("p.txt", ""), ("p.jsonl", ""), ("p.jsonl", "\n  \n")])
def test_no_prompts(tmp_path, name, text):
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match="no prompts"):
        read_prompts(f)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_prompts(tmp_path / "absent.txt")
