"""The `specdepth` command: one subcommand per module, each exposing `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

SUBCOMMANDS = ("generate", "policies", "profile", "record", "synth", "replay", "tune")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specdepth", description="Adaptive-depth speculative decoding, "
                                 "lossless, on Ray workers (bundled CPU pair by default).")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(f"specdepth.experiments.cmd_{name}")
        except ModuleNotFoundError as e:
            if e.name != f"specdepth.experiments.cmd_{name}":
                raise
            continue
        mod.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="specdepth: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError) as e:
        print(f"specdepth {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
