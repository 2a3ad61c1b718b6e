"""specdepth's cache directory: where what is measured or compiled once per machine is kept."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """specdepth's cache directory: SPECDEPTH_CACHE, else ~/.cache/specdepth."""
    return Path(os.environ.get("SPECDEPTH_CACHE", Path.home() / ".cache" / "specdepth"))
