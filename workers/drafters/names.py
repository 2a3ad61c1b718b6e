"""The drafters' names and the command line's default, importable without torch."""

DRAFTER_NAMES = ("model", "ngram", "suffix", "hybrid")  # hybrid: suffix or the model, per sequence
MODEL_FREE = ("ngram", "suffix")  # drafters that run no model pass
DEFAULT_DRAFTER = "suffix"  # what `generate` and `serve` draft with unless told (README: why)
