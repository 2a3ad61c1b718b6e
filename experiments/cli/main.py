"""The `specdepth` command: one subcommand per module, each exposing `register(subparsers)`.

Every input gets an answer, never a traceback: a bad flag stops at parse time (argparse's usage
and `error:` lines, exit 2); a failure while running is one line `specdepth CMD: error: ...`,
exit 2 for bad input (a malformed file, a bad value found late), 1 for a runtime failure (the
system refused, a request failed) and 1 for an internal error, whose line names the exception
and points at `specdepth --debug CMD ...`, which shows the traceback instead.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import logging
import os
import sys
import zlib

SUBCOMMANDS = ("generate", "policies", "profile", "record", "synth", "replay", "tune", "serve", "export")
DEBUG_HINT = "(run with --debug for the traceback)"
# OSErrors that mean the input named something that is not there or not usable, as opposed to
# the system failing under a good input (disk full, I/O error, out of memory: exit 1)
INPUT_OSERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, FileExistsError)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specdepth", description="Adaptive-depth speculative decoding, "
                                 "lossless, on Ray workers (bundled CPU pair by default).")
    ap.add_argument("--debug", action="store_true", help="on an error, show the full traceback")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:  # one module per subcommand, each with its own register(sub)
        importlib.import_module(f"specdepth.experiments.cli.{name}").register(sub)
    return ap


def _input_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean a bad input (exit 2): values, files of the wrong kind, decoding."""
    kinds: list[type[BaseException]] = [ValueError, *INPUT_OSERRORS, EOFError, zlib.error, gzip.BadGzipFile,
                                        json.JSONDecodeError, UnicodeError]
    safetensors = sys.modules.get("safetensors")  # a model file that is not one; imported only if used
    if safetensors is not None and hasattr(safetensors, "SafetensorError"):
        kinds.append(safetensors.SafetensorError)
    return tuple(kinds)


def error_line(command: str | None, exc: BaseException) -> tuple[str, int]:
    """The one line reporting `exc` from `specdepth command` (None: before one was parsed), and
    the exit status.

    Returns:
        (line, 2) for a bad input, (line, 1) for a runtime failure (an OSError or MemoryError),
        (line with the exception's type and the --debug hint, 1) for anything else.
    """
    prog = f"specdepth {command}" if command else "specdepth"
    msg = " ".join(str(exc).split())
    if isinstance(exc, _input_errors()):
        return f"{prog}: error: {msg or type(exc).__name__}", 2
    if isinstance(exc, (OSError, MemoryError)):
        return f"{prog}: error: {type(exc).__name__}: {msg}".rstrip(": "), 1
    return f"{prog}: error: internal error {type(exc).__name__}: {msg} {DEBUG_HINT}", 1


def report(command: str | None, exc: BaseException) -> int:
    """Print `exc`'s one line (see `error_line`) on stderr; returns the exit status. For a
    subcommand that handles its expected failures itself and still returns a status."""
    line, code = error_line(command, exc)
    print(line, file=sys.stderr)
    return code


def _quiet_stdout() -> None:
    """After a broken pipe (`specdepth ... | head`): point stdout at devnull so the interpreter's
    final flush does not print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Run `specdepth ARGV`; returns the exit status (argparse exits 2 itself on a bad flag)."""
    logging.basicConfig(level=logging.WARNING, format="specdepth: %(message)s", stream=sys.stderr)
    raw = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in raw[: next((i for i, a in enumerate(raw) if a in SUBCOMMANDS), len(raw))]
    command = None
    try:
        args = build_parser().parse_args(raw)
        command, debug = args.command, args.debug
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 1
    except Exception as e:  # noqa: BLE001 - the one place every failure becomes one line
        if debug:
            raise
        return report(command, e)


if __name__ == "__main__":
    sys.exit(main())
