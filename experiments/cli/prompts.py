"""Prompt files as users have them: plain text, one prompt per line, or JSON lines.

Plain text: every line is one prompt, exactly as written (a backslash followed by `n` stays those
two characters; an empty line is an empty prompt, kept so that outputs stay aligned with lines).
JSON lines (`{"prompt": "..."}` per line, so one prompt can span lines): chosen by a `.jsonl`
suffix or by a first non-empty line that parses as a JSON object; blank lines between records
are skipped, other keys on a record are ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

_BOM = b"\xef\xbb\xbf"
SAMPLING_KEYS = ("temperature", "top_p", "seed")  # a JSON lines record's own sampling settings


def read_prompts(path: str | Path) -> list[str]:
    """The prompts in `path`, in file order (`read_records`' prompts)."""
    return [prompt for _, prompt, _ in read_records(path)]


def read_records(path: str | Path) -> list[tuple[int, str, dict]]:
    """(line number, prompt, the record's own `SAMPLING_KEYS` as written) per prompt of `path`, in
    file order; a plain text line has none (`sampling_settings` checks them).

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: `file:line: reason` for a line that is not UTF-8, or, in a JSON lines file,
            not a JSON object with a string "prompt"; `file: no prompts` for an empty file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no prompts file at {path}")
    data = path.read_bytes().removeprefix(_BOM)
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()  # the newline that ends the last line does not start another
    lines = [_decode(path, n, line.removesuffix(b"\r")) for n, line in enumerate(raw, 1)]
    if not lines:
        raise ValueError(f"{path}: no prompts")
    if is_json_lines(path, lines):
        records = [(n, *_json_prompt(path, n, line)) for n, line in enumerate(lines, 1) if line.strip()]
        if not records:
            raise ValueError(f"{path}: no prompts")
        return records
    return [(n, line, {}) for n, line in enumerate(lines, 1)]


def is_json_lines(path: Path, lines: list[str]) -> bool:
    """True for a `.jsonl` file, or when the first non-empty line is a JSON object."""
    if path.suffix.lower() == ".jsonl":
        return True
    first = next((line for line in lines if line.strip()), None)
    if first is None or not first.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False


def _decode(path: Path, n: int, line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{n}: not UTF-8 text (byte {e.start + 1} of the line)") from None


def _json_prompt(path: Path, n: int, line: str) -> tuple[str, dict]:
    """The "prompt" string of JSON lines record `line` (line number `n`), and the record's
    `SAMPLING_KEYS` that are set."""
    where = f"{path}:{n}"
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e.msg}: column {e.colno})") from None
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object like {{\"prompt\": \"...\"}}, "
                         f"got a JSON {_json_kind(rec)}")
    if "prompt" not in rec:
        raise ValueError(f"{where}: no \"prompt\" key (keys: {', '.join(sorted(rec)) or 'none'})")
    prompt = rec["prompt"]
    if not isinstance(prompt, str):
        raise ValueError(f"{where}: \"prompt\" must be a string, got a JSON {_json_kind(prompt)}")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: \"prompt\" holds an unpaired surrogate escape (not valid text)") from None
    return prompt, {k: rec[k] for k in SAMPLING_KEYS if rec.get(k) is not None}


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)



def sampling_settings(path: str | Path, n: int, own: dict) -> dict:
    """A record's own sampling settings (`read_records`), checked.

    Raises:
        ValueError: `file:line: reason` for a setting of the wrong type or out of range.
    """
    for k, v in own.items():
        kind = int if k == "seed" else (int, float)
        if isinstance(v, bool) or not isinstance(v, kind):
            raise ValueError(f"{path}:{n}: \"{k}\" must be {'an integer' if k == 'seed' else 'a number'}, "
                             f"got a JSON {_json_kind(v)}")
    if own.get("temperature", 0) < 0 or not 0 < own.get("top_p", 1) <= 1 \
            or not 0 <= own.get("seed", 0) < 1 << 63:
        raise ValueError(f"{path}:{n}: need temperature >= 0, 0 < top_p <= 1 and 0 <= seed < 2^63; got "
                         + ", ".join(f"{k} {v}" for k, v in own.items()))
    return own
