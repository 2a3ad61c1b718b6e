"""Acceptance traces: what a draft/target pair does on a set of prompts, recorded once, replayed often.

With a greedy target, what any depth policy would see and get is fixed by the pair and the prompt
(DESIGN.md "Traces and exact replay"). For every output position t of a request, a trace keeps the
draft's greedy chain of K tokens started from the true prefix (prompt + tokens[:t]): its confidence
features (top-1 probability and entropy per chain position) and `match[t]`, how many leading chain
tokens equal the target's tokens[t], tokens[t + 1], ... A policy verifying d tokens at t accepts
min(d, match[t]), emits that + 1 and moves to t + a + 1.

File format (schema 1): JSON lines, gzip allowed (a `.gz` name). Line 1 is the header

    {"kind": "specdepth-trace", "schema": 1, "target": ..., "draft": ..., "tokenizer": ...,
     "k_max": K, "temperature": T, "created": ISO time, ...extra keys kept as `meta`}

then one line per request

    {"id": str, "prompt_len": int, "tokens": [T ints: the target's output],
     "match": [T ints], "top1": [[K floats] x T], "entropy": [[K floats] x T],
     "accept_prob": [[K floats] x T]   (sampling traces only: 1 - TV(p, q) per chain position)}

`match[t]` compares the chain only up to the end of the output: 0 <= match[t] <= min(K, T - t).
That is all a replay needs, since a request at t can emit at most T - t more tokens (its verify
length is capped at T - t - 1). A top1 of 0 marks a chain position never drafted. Features are
stored at float32 precision (the models' own), so a recorded trace replays bit-exactly.
Loading validates everything and raises `TraceError`, one line naming the file and line.
"""

from __future__ import annotations

import datetime
import gzip
import json
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

KIND = "specdepth-trace"
SCHEMA = 1
HEADER_KEYS = ("target", "draft", "tokenizer", "k_max", "temperature", "created")


class TraceError(ValueError):
    """A malformed trace file; the message is one line, `file:line: what is wrong`."""

    def __init__(self, path: str | Path, line: int | None, msg: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {' '.join(str(msg).split())}")


@dataclass(frozen=True)
class TraceHeader:
    target: str  # what produced the tokens (a path, "bundled", "synthetic", ...)
    draft: str
    tokenizer: str
    k_max: int  # K: chain length recorded at every position
    temperature: float  # 0: greedy (exact replay); > 0: sampling (accept_prob, approximate replay)
    created: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"))
    meta: dict[str, Any] = field(default_factory=dict)  # any other header keys (e.g. synth parameters)

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    def to_json(self) -> dict[str, Any]:
        return {"kind": KIND, "schema": SCHEMA, "target": self.target, "draft": self.draft,
                "tokenizer": self.tokenizer, "k_max": self.k_max, "temperature": self.temperature,
                "created": self.created, **self.meta}


@dataclass
class TraceRequest:
    id: str
    prompt_len: int
    tokens: np.ndarray  # (T,) int64: the target's output
    match: np.ndarray  # (T,) int64: leading chain tokens at t equal to tokens[t:]
    top1: np.ndarray  # (T, K) float64: draft top-1 probability at each chain position (0: not drafted)
    entropy: np.ndarray  # (T, K) float64: draft entropy (nats)
    accept_prob: np.ndarray | None = None  # (T, K) float64: 1 - TV(p, q); sampling traces only

    def __len__(self) -> int:
        return len(self.tokens)

    def to_json(self) -> str:
        line = {"id": self.id, "prompt_len": int(self.prompt_len), "tokens": self.tokens.tolist(),
                "match": self.match.tolist(), "top1": "@top1", "entropy": "@entropy"}
        floats = {"top1": self.top1, "entropy": self.entropy}
        if self.accept_prob is not None:
            line["accept_prob"], floats["accept_prob"] = "@accept_prob", self.accept_prob
        text = json.dumps(line, separators=(",", ":"))
        for key, arr in floats.items():
            text = text.replace(f'"@{key}"', _f32_rows(arr), 1)
        return text


def _f32_rows(arr: np.ndarray) -> str:
    """(T, K) floats as a JSON list of lists, each value the shortest text that reads back as
    the same float32 (what the models produce): exact and compact."""
    def fmt(x: np.float32) -> str:
        return np.format_float_positional(x, unique=True, trim="-")
    return "[" + ",".join("[" + ",".join(map(fmt, row)) + "]" for row in np.asarray(arr, np.float32)) + "]"


@dataclass
class TraceSet:
    """A header and its requests, plus flat arrays over all positions for vectorised replay."""

    header: TraceHeader
    requests: list[TraceRequest]

    def __post_init__(self) -> None:
        K = self.header.k_max
        self.lengths = np.array([len(r) for r in self.requests], np.int64)  # (R,)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)  # (R + 1,)
        self.prompt_lens = np.array([r.prompt_len for r in self.requests], np.int64)  # (R,)
        cat = (lambda xs, w: np.concatenate(xs) if xs else np.zeros((0, w) if w else 0))
        self.match = cat([r.match for r in self.requests], 0).astype(np.int64)  # (P,)
        self.top1 = cat([r.top1 for r in self.requests], K).reshape(-1, K)  # (P, K)
        self.entropy = cat([r.entropy for r in self.requests], K).reshape(-1, K)  # (P, K)
        self.accept_prob = (cat([r.accept_prob for r in self.requests], K).reshape(-1, K)  # (P, K)
                            if self.header.sampling else None)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def k_max(self) -> int:
        return self.header.k_max

    def save(self, path: str | Path) -> None:
        """Write the trace file (gzip when the name ends in .gz)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _open(path, "wt") as f:
            f.write(json.dumps(self.header.to_json(), separators=(",", ":")) + "\n")
            for r in self.requests:
                f.write(r.to_json() + "\n")

    @staticmethod
    def concat(sets: Sequence["TraceSet"]) -> "TraceSet":
        """One set from several (e.g. several files): chains cut to the smallest K.

        Raises:
            ValueError: greedy and sampling traces mixed, or no sets.
        """
        if not sets:
            raise ValueError("no traces given")
        if len({s.header.sampling for s in sets}) > 1:
            raise ValueError("cannot mix greedy (temperature 0) and sampling traces in one replay")
        if len(sets) == 1:
            return sets[0]
        K = min(s.k_max for s in sets)
        reqs = [TraceRequest(r.id, r.prompt_len, r.tokens, np.minimum(r.match, K), r.top1[:, :K],
                             r.entropy[:, :K], None if r.accept_prob is None else r.accept_prob[:, :K])
                for s in sets for r in s.requests]
        h = sets[0].header
        head = TraceHeader(" + ".join(dict.fromkeys(s.header.target for s in sets)),
                           " + ".join(dict.fromkeys(s.header.draft for s in sets)), h.tokenizer, K,
                           h.temperature, h.created, {"merged": len(sets)})
        return TraceSet(head, reqs)


# ---- reading ---------------------------------------------------------------------------------
def _open(path: Path, mode: str):
    if path.suffix == ".gz":
        return gzip.open(path, mode, encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line; a truncated or corrupt gzip is a TraceError at the line
    where reading failed."""
    n = 0
    try:
        with _open(path, "rt") as f:
            for n, text in enumerate(f, 1):
                yield n, text
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise TraceError(path, n + 1, f"corrupt or truncated gzip ({e})") from None
    except UnicodeDecodeError as e:
        raise TraceError(path, n + 1, f"not UTF-8 text ({e})") from None
    except OSError as e:
        raise TraceError(path, None, f"cannot read ({e})") from None


def _parse_header(obj: Any) -> TraceHeader:
    """Raises ValueError describing the first problem."""
    if not isinstance(obj, dict) or obj.get("kind") != KIND:
        raise ValueError(f"missing header: the first line must be a {{\"kind\": \"{KIND}\", \"schema\": "
                         f"{SCHEMA}, ...}} object")
    if obj.get("schema") != SCHEMA:
        raise ValueError(f"trace schema {obj.get('schema')!r} is not supported (this specdepth reads "
                         f"schema {SCHEMA})")
    missing = [k for k in HEADER_KEYS if k not in obj]
    if missing:
        raise ValueError(f"header lacks {', '.join(missing)}")
    k, temp = obj["k_max"], obj["temperature"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"header k_max must be an integer >= 1, got {k!r}")
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or not temp >= 0:
        raise ValueError(f"header temperature must be a number >= 0, got {temp!r}")
    for key in ("target", "draft", "tokenizer", "created"):
        if not isinstance(obj[key], str):
            raise ValueError(f"header {key} must be a string, got {obj[key]!r}")
    meta = {k: v for k, v in obj.items() if k not in (*HEADER_KEYS, "kind", "schema")}
    return TraceHeader(obj["target"], obj["draft"], obj["tokenizer"], k, float(temp), obj["created"], meta)


def _array(obj: dict, key: str, shape: tuple[int, ...], kind: str) -> np.ndarray:
    """obj[key] as an array of `shape`; kind "int" (JSON integers) or "prob"/"nonneg" floats."""
    if key not in obj:
        raise ValueError(f"missing field {key!r}")
    try:
        arr = np.asarray(obj[key])
    except ValueError:
        raise ValueError(f"{key}: ragged or non-numeric lists") from None
    ok_kinds = "iu" if kind == "int" else "iuf"
    if arr.dtype.kind not in ok_kinds or arr.shape != shape:
        want = "integers" if kind == "int" else "numbers"
        raise ValueError(f"{key}: expected {want} of shape {list(shape)}, got "
                         f"{arr.dtype.kind if arr.size else 'empty'} array of shape {list(arr.shape)}")
    if kind == "int":
        return arr.astype(np.int64)
    vals = arr.astype(np.float32).astype(np.float64)  # features are float32 data
    if not np.isfinite(vals).all() or (vals < 0).any() or (kind == "prob" and (vals > 1).any()):
        rng = "[0, 1]" if kind == "prob" else ">= 0"
        raise ValueError(f"{key}: values must be finite and {rng}")
    return vals


def _parse_request(obj: Any, K: int, sampling: bool) -> TraceRequest:
    """Raises ValueError describing the first problem."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object per request, got {type(obj).__name__}")
    if obj.get("kind") == KIND:
        raise ValueError("a second header")
    rid, plen = obj.get("id"), obj.get("prompt_len")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise ValueError(f"id must be a string, got {rid!r}")
    if isinstance(plen, bool) or not isinstance(plen, int) or plen < 0:
        raise ValueError(f"prompt_len must be an integer >= 0, got {plen!r}")
    tokens = obj.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError("tokens must be a non-empty list of token ids")
    T = len(tokens)
    toks = _array(obj, "tokens", (T,), "int")
    match = _array(obj, "match", (T,), "int")
    cap = np.minimum(K, T - np.arange(T))
    bad = np.flatnonzero((match < 0) | (match > cap))
    if len(bad):
        t = int(bad[0])
        raise ValueError(f"match[{t}] = {int(match[t])} outside [0, {int(cap[t])}] (K = {K}, {T} tokens)")
    top1 = _array(obj, "top1", (T, K), "prob")
    ent = _array(obj, "entropy", (T, K), "nonneg")
    ap = None
    if sampling:
        ap = _array(obj, "accept_prob", (T, K), "prob")
    elif "accept_prob" in obj:
        raise ValueError("accept_prob in a greedy trace (header temperature 0)")
    return TraceRequest(str(rid), plen, toks, match, top1, ent, ap)


def load_traces(path: str | Path) -> TraceSet:
    """Read and validate one trace file (.jsonl or .jsonl.gz).

    Raises:
        TraceError: one line, `file:line: problem` (no header, wrong schema, a malformed or
            inconsistent request line, a duplicate id, truncated gzip, no requests).
    """
    path = Path(path)
    header: TraceHeader | None = None
    requests: list[TraceRequest] = []
    seen: set[str] = set()
    for n, text in _lines(path):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(path, n, f"not valid JSON ({e.msg} at column {e.colno})") from None
        except (ValueError, RecursionError) as e:  # an integer past Python's digit limit; nesting too deep
            raise TraceError(path, n, f"not a trace line ({type(e).__name__}: {e})") from None
        try:
            if header is None:
                header = _parse_header(obj)
                continue
            req = _parse_request(obj, header.k_max, header.sampling)
        except ValueError as e:
            raise TraceError(path, n, str(e)) from None
        if req.id in seen:
            raise TraceError(path, n, f"duplicate request id {req.id!r}")
        seen.add(req.id)
        requests.append(req)
    if header is None:
        raise TraceError(path, 1, "empty file: missing header")
    if not requests:
        raise TraceError(path, None, "no requests after the header")
    return TraceSet(header, requests)


def load_trace_files(paths: Iterable[str | Path]) -> TraceSet:
    """Load and merge several files (see `TraceSet.concat`). Raises TraceError or ValueError."""
    return TraceSet.concat([load_traces(p) for p in paths])


# ---- recording ---------------------------------------------------------------------------------
def match_lengths(chains: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """(T,) leading agreement of each chain with the output: chains (T, K) drafted at t from the
    true prefix, tokens (T,) the target's output; chain position j at t is compared with
    tokens[t + j] while t + j < T."""
    T, K = chains.shape
    idx = np.arange(T)[:, None] + np.arange(K)[None, :]  # (T, K)
    want = np.where(idx < T, tokens[np.minimum(idx, T - 1)], -1)  # -1: past the output, never equal
    return np.cumprod(chains == want, axis=1).sum(1).astype(np.int64)


@dataclass
class _Recording:
    index: int
    prompt: list[int]
    max_new: int
    chains: list[np.ndarray] = field(default_factory=list)  # T x (K,)
    top1: list[np.ndarray] = field(default_factory=list)
    entropy: list[np.ndarray] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def record_traces(pair: Any, prompts: Sequence[str | Sequence[int]], k_max: int = 8,
                  max_new_tokens: int = 128, batch: int = 16, progress: bool = True,
                  temperature: float = 0.0, seed: int = 0, compile: str = "off",
                  drafter: str = "model", drafter_options: dict | None = None) -> TraceSet:
    """Run the pair on the prompts with the live PairRunner and record a trace.

    Every step drafts K tokens for every sequence and verifies none (plain decoding: the target
    adds one token per step), so the draft's chain is recorded from the true prefix at every
    output position; `match` is computed afterwards against the output.

    Args:
        pair: a `workers.bundled.Pair` (or anything with .target, .draft, and optionally
            .tokenizer, .eos_ids, .name).
        prompts: text (needs pair.tokenizer) or token-id lists.
        k_max: K, the chain length.
        max_new_tokens: output tokens per request (fewer at EOS or the context limit).
        batch: sequences decoded together.
        progress: show a tqdm bar (requests).
        temperature: 0 for greedy; > 0 records a sampling trace (sampled output and chains, plus
            accept_prob = 1 - TV(p, q) along each chain from an extra full forward of both models).
        seed: sampling seed.
        compile: the passes' path, auto|on|off (a trace records what the path that serves sees).
        drafter: what drafts the chains (`workers/drafters/`); a model-free drafter's chain at t
            holds what it drafted from the true prefix (fewer than K where its match ends; its
            features are 0 past that), and the header's `drafter` tells replay to price it free.
            With suffix decoding the chains also depend on the outputs finished before t, as
            recorded here.
        drafter_options: its options (ngram: ngram_min, ngram_max).
    Returns:
        The TraceSet (save it with `.save(path)`).
    Raises:
        ValueError: an empty prompt, or one that leaves no room to generate.
    """
    from tqdm import tqdm

    from specdepth.workers.runner import PairRunner
    from specdepth.workers.sampler import SamplingParams

    tok = getattr(pair, "tokenizer", None)
    if tok is None and any(isinstance(p, str) for p in prompts):
        raise ValueError("text prompts need the pair's tokenizer; give token ids instead")
    ids = [tok.encode(p) if isinstance(p, str) else [int(x) for x in p] for p in prompts]
    if drafter == "hybrid":
        raise ValueError("--drafter hybrid: record one trace per drafter (model, and ngram or suffix); "
                         "a trace of both chains is not recorded yet")
    if drafter != "model" and temperature > 0:
        raise ValueError(f"a sampling trace records the draft model's q: --drafter {drafter} records greedy traces only")
    runner = PairRunner(pair.target, pair.draft, n_slots=batch, max_depth=k_max,
                        sampling=SamplingParams(temperature=temperature), seed=seed, compile=compile,
                        drafter=drafter, drafter_options=drafter_options)
    todo: deque[_Recording] = deque()
    for i, p in enumerate(ids):
        if not p or len(p) >= runner.max_len:
            raise ValueError(f"prompt {i}: {len(p)} tokens; need 1 to {runner.max_len - 1}")
        todo.append(_Recording(i, p, min(max_new_tokens, runner.max_len - len(p))))
    eos = set(getattr(pair, "eos_ids", ()) or ())
    done: list[TraceRequest | None] = [None] * len(ids)
    running: dict[int, _Recording] = {}
    no_verify = (lambda top1, ent, drafted: np.zeros(len(drafted), np.int64))
    bar = tqdm(total=len(ids), desc="record", unit="req", disable=not progress)
    while todo or running:
        admit = [todo.popleft() for _ in range(min(batch - len(running), len(todo)))]
        for slot, rec in zip(runner.add_many([r.prompt for r in admit]), admit):
            running[slot] = rec
        slots = np.array(sorted(running), np.int64)
        res = runner.step(slots, np.full(len(slots), k_max, np.int64), None, no_verify)
        chains = runner.last_draft_tokens  # (B, K)
        for r, s in enumerate(slots):
            rec = running[int(s)]
            if r in res.failed:
                raise RuntimeError(f"prompt {rec.index}: {res.failed[r]}")
            rec.chains.append(chains[r].copy())
            rec.top1.append(res.top1[r].astype(np.float32))
            rec.entropy.append(res.entropy[r].astype(np.float32))
            rec.tokens.append(int(res.emitted[r][0]))
            if rec.tokens[-1] in eos or len(rec.tokens) >= rec.max_new:
                runner.remove(int(s))
                del running[int(s)]
                done[rec.index] = _finish(rec, pair, temperature)
                bar.update(1)
    bar.close()
    name = getattr(pair, "name", "pair")
    target, _, draft = name.partition("|")
    header = TraceHeader(target or name, draft or name, str(getattr(tok, "path", "none")), k_max,
                         float(temperature), meta={"max_new_tokens": max_new_tokens, "source": "record",
                                                   "drafter": drafter})
    return TraceSet(header, [r for r in done if r is not None])


def _finish(rec: _Recording, pair: Any, temperature: float) -> TraceRequest:
    chains = np.stack(rec.chains)  # (T, K)
    tokens = np.array(rec.tokens, np.int64)  # (T,)
    top1 = np.stack(rec.top1).astype(np.float64)  # (T, K)
    ent = np.stack(rec.entropy).astype(np.float64)
    ap = None if temperature == 0 else _accept_probs(pair, rec.prompt, tokens, chains, temperature)
    drafted = np.cumprod(top1 > 0, axis=1).sum(1)  # (T,) a model-free drafter's chain may end early
    match = np.minimum(match_lengths(chains, tokens), drafted)
    return TraceRequest(str(rec.index), len(rec.prompt), tokens, match, top1, ent, ap)


def _accept_probs(pair: Any, prompt: list[int], tokens: np.ndarray, chains: np.ndarray,
                  temperature: float, rows_per_pass: int = 16) -> np.ndarray:
    """(T, K) 1 - TV(p_j, q_j) along each chain: p, q the target's and draft's distributions (at
    the temperature) after prompt + tokens[:t] + chain[:j]. Full causal forwards, no cache."""
    import torch

    from specdepth.workers.sampler import SamplingParams, probs_from_logits

    sp = SamplingParams(temperature=temperature)
    T, K = chains.shape
    out = np.zeros((T, K))
    dev = pair.target.device
    for lo in range(0, T, rows_per_pass):
        ts = range(lo, min(lo + rows_per_pass, T))
        seqs = [prompt + tokens[:t].tolist() + chains[t].tolist() for t in ts]
        x = torch.zeros((len(seqs), max(map(len, seqs))), dtype=torch.long)
        for i, s in enumerate(seqs):
            x[i, : len(s)] = torch.tensor(s)  # right padding: causal, so it never reaches real rows
        start = torch.tensor([len(prompt) + t - 1 for t in ts])[:, None] + torch.arange(K)[None, :]  # (b, K)
        with torch.inference_mode():
            pq = []
            for model in (pair.target, pair.draft):
                logits = model.forward_train(x.to(dev))  # (b, S, V)
                rows = logits[torch.arange(len(seqs))[:, None], start.to(dev)]  # (b, K, V)
                pq.append(probs_from_logits(rows.float(), sp))
        out[lo: lo + len(seqs)] = (1.0 - 0.5 * (pq[0] - pq[1]).abs().sum(-1)).clamp(0, 1).cpu().numpy()
    return out
