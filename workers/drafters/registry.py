"""Drafters by name: `--drafter model|ngram|suffix|hybrid` on the command line."""

from __future__ import annotations

from typing import Callable

from specdepth.workers.drafters.base import Drafter
from specdepth.workers.drafters.hybrid import HybridDrafter
from specdepth.workers.drafters.model import ModelDrafter
from specdepth.workers.drafters.ngram import NgramDrafter
from specdepth.workers.drafters.suffix import SuffixDrafter

# name -> factory(runner, **options) -> Drafter
DRAFTERS: dict[str, Callable[..., Drafter]] = {"model": ModelDrafter, "ngram": NgramDrafter,
                                                "suffix": SuffixDrafter, "hybrid": HybridDrafter}


def make_drafter(name: str, runner, **options) -> Drafter:
    """The drafter called `name` for this runner (`workers.runner.PairRunner`).

    Raises:
        ValueError: an unknown name, or options that drafter refuses.
    """
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}; expected one of {sorted(DRAFTERS)}")
    return DRAFTERS[name](runner, **options)


def drafter_options(name: str, ngram: tuple[int, int] = (1, 4)) -> dict:
    """The keyword options `make_drafter(name, ...)` takes from the command line's flags."""
    return {"ngram_min": ngram[0], "ngram_max": ngram[1]} if name == "ngram" else {}
