"""`specdepth export`: write a model as a Hugging Face checkpoint folder (transformers and vLLM load it).

    specdepth export --hf DIR [--model bundled-target|bundled-draft|PATH]

PATH is a specdepth `.safetensors` model (its tokenizer.json beside it, as the bundled pair's).
The folder gets config.json, model.safetensors with HF tensor names, the tokenizer and the EOS
ids (`workers/hf_export.py`). To run the bundled pair in vLLM, export both models:

    specdepth export --hf /tmp/target && specdepth export --hf /tmp/draft --model bundled-draft
"""

from __future__ import annotations

import argparse
from pathlib import Path

BUNDLED = ("bundled-target", "bundled-draft")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("export", help="write a model as a Hugging Face checkpoint folder",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf", required=True, type=_folder, help="the folder to write (created)")
    p.add_argument("--model", default="bundled-target", type=_model,
                   help="bundled-target (default), bundled-draft, or a specdepth .safetensors file")
    p.set_defaults(func=run)


def _folder(text: str) -> Path:
    p = Path(text)
    if not text or (p.exists() and not p.is_dir()):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    return p


def _model(text: str) -> str:
    if text in BUNDLED:
        return text
    from specdepth.experiments.cli.spec_types import model_path
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: already a Hugging Face folder (export takes a specdepth "
                                         ".safetensors file, bundled-target or bundled-draft)")
    return model_path(text)


def run(args: argparse.Namespace) -> int:
    from specdepth.workers.bundled import BUNDLED_DIR
    from specdepth.workers.hf_export import export_hf
    from specdepth.workers.weights import load_model
    from specdepth.workers.tokenizer import Tokenizer

    path = BUNDLED_DIR / f"{args.model.removeprefix('bundled-')}.safetensors" if args.model in BUNDLED \
        else Path(args.model)
    tok_path = path.parent / "tokenizer.json"
    tok = Tokenizer(tok_path) if tok_path.exists() else None
    out = export_hf(load_model(path, device="cpu"), args.hf, tok)
    print(f"wrote {out}: config.json, model.safetensors"
          + (", tokenizer.json, tokenizer_config.json, generation_config.json" if tok else
             f" (no tokenizer.json beside {path}: none written)"))
    return 0
