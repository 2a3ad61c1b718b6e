"""Tokenizer: a thin wrapper over HF `tokenizers` loaded from a `tokenizer.json`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from tokenizers import Tokenizer as _HFTokenizer

EOT = "<|endoftext|>"


class Tokenizer:
    def __init__(self, path: str | Path, eos_tokens: tuple[str, ...] = (EOT,),
                 eos_ids: Optional[Sequence[int]] = None) -> None:
        """eos_ids, when given, overrides eos_tokens (a checkpoint's config names ids, not strings)."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"no tokenizer at {path}")
        self.path = path
        self._tok = _HFTokenizer.from_file(str(path))
        if eos_ids is not None:
            self.eos_ids: tuple[int, ...] = tuple(int(i) for i in eos_ids)
        else:
            ids = [self._tok.token_to_id(t) for t in eos_tokens]
            self.eos_ids = tuple(i for i in ids if i is not None)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)
