"""The bundled pair's corpus: the running interpreter's standard library sources, split by module.

The held-out split is a fixed list of top-level modules (below), so it depends neither on the
file-system order nor on files a Python patch release adds. Everything else that qualifies is
training data. Excluded: tests (`test`/`tests` folders, `test_*.py`), `idlelib`, `site-packages`.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

HELDOUT_MODULES: tuple[str, ...] = (
    "argparse", "calendar", "configparser", "csv", "difflib", "fractions", "ftplib", "getopt",
    "gettext", "heapq", "ipaddress", "json", "shlex", "statistics", "tarfile", "textwrap",
    "uuid", "wave",
)
EXCLUDED_PARTS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def module_of(rel: Path) -> str:
    """Top-level module name of a path relative to the stdlib root: json/decoder.py -> json."""
    return rel.parts[0][:-3] if len(rel.parts) == 1 else rel.parts[0]


def source_files(root: Path | None = None) -> list[Path]:
    """All qualifying *.py files, sorted by relative path (independent of directory order)."""
    root = root or stdlib_root()
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if EXCLUDED_PARTS & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def split_files(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """(train, held-out) file lists."""
    root = root or stdlib_root()
    train, held = [], []
    for p in source_files(root):
        (held if module_of(p.relative_to(root)) in HELDOUT_MODULES else train).append(p)
    return train, held


def read_text(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


def cut_prompts(files: list[Path], n_lines: int = 3) -> list[str]:
    """Prompts from source: each function or class header plus its first `n_lines` body lines.

    Ordered by file then line, deduplicated. Docstring-only bodies are kept: they are code too.
    """
    prompts: list[str] = []
    seen: set[str] = set()
    for p in files:
        text = read_text(p)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or not node.body:
                continue
            first_body = node.body[0].lineno - 1
            block = lines[node.lineno - 1: first_body + n_lines]
            indent = len(block[0]) - len(block[0].lstrip())
            prompt = "\n".join(line[indent:] for line in block).rstrip() + "\n"
            if 40 <= len(prompt) <= 600 and prompt not in seen:
                seen.add(prompt)
                prompts.append(prompt)
    return prompts


def cut_prose(files: list[Path], min_chars: int = 80, max_chars: int = 400) -> list[str]:
    """Prose prompts from source: the English of docstrings (module, class, function), each cut to
    its first paragraph and dedented; ordered by file then position, deduplicated. For the pair,
    which learned code, they are the text that repeats least."""
    prompts: list[str] = []
    seen: set[str] = set()
    for p in files:
        try:
            tree = ast.parse(read_text(p))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            doc = ast.get_docstring(node)
            para = (doc or "").split("\n\n")[0].strip()
            if min_chars <= len(para) <= max_chars and para not in seen:
                seen.add(para)
                prompts.append(para)
    return prompts
