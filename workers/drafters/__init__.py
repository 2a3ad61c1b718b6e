"""Drafters: what proposes the draft tokens that the target verifies. One per file behind the
`Drafter` protocol (`base.py`): the draft model, n-gram lookup, suffix decoding; by name in `registry`."""
