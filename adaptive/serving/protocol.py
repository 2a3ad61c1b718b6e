"""The OpenAI completions protocol as the server speaks it: request checks, errors, streamed text.

Plain Python (no FastAPI, no Ray) so each rule is unit-testable. `parse_completion` turns a JSON
body into a `CompletionParams` or raises `ApiError` (an OpenAI-style 400 naming the parameter);
`TextStream` turns a request's committed tokens into text chunks, each character once, cut at
the first stop string.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from specdepth.workers.sampler import SamplingParams

MAX_STOPS = 4  # stop strings per request, as OpenAI allows
FINISH = {"length": "length", "context": "length", "eos": "stop", "stop": "stop"}  # ours -> OpenAI's


class ApiError(Exception):
    """An OpenAI-style error: HTTP status and `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400,
                 type_: str = "invalid_request_error", code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type_, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ServerLimits:
    """What the server can honour; requests are checked against it."""

    model_name: str
    max_len: int  # context limit in tokens (prompt + completion)
    vocab_size: int
    sampling: SamplingParams = SamplingParams()  # the server's defaults; each request may set its own


@dataclass
class CompletionParams:
    """One checked completions request (a chat request becomes one prompt)."""

    prompts: list[list[int]]  # token ids per prompt
    max_tokens: int
    stream: bool = False
    stop: list[str] = field(default_factory=list)
    include_usage: bool = False  # stream_options.include_usage: a last chunk with usage
    sampling: Optional[SamplingParams] = None  # this request's temperature, top_p and seed (None: the server's)


def _number(body: dict, name: str, default: Any, kind: type) -> Any:
    v = body.get(name)
    if v is None:
        return default
    ok = isinstance(v, int) if kind is int else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or (kind is float and not math.isfinite(v)):
        raise ApiError(f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {v!r}", name)
    return v


def check_sampling(body: dict, limits: ServerLimits) -> SamplingParams:
    """The request's temperature, top_p and seed, each defaulting to the server's (`specdepth
    serve --temperature --top-p`); the replicas serve rows of different settings in one batch
    (workers/row_sampling.py). A seed makes a sampled completion repeat.

    Raises:
        ApiError: a value out of range, naming it.
    """
    sp = limits.sampling
    t = _number(body, "temperature", None, float)
    if t is not None and t < 0:
        raise ApiError(f"'temperature' must be >= 0, got {t}", "temperature")
    p = _number(body, "top_p", None, float)
    if p is not None and not 0 < p <= 1:
        raise ApiError(f"'top_p' must be in (0, 1], got {p}", "top_p")
    seed = _number(body, "seed", None, int)
    if seed is not None and not 0 <= seed < 1 << 63:
        raise ApiError(f"'seed' must be in [0, 2^63), got {seed}", "seed")
    return SamplingParams(sp.temperature if t is None else float(t), sp.top_p if p is None else float(p), seed)


def prompt_ids(body: dict, tokenizer: Any, limits: ServerLimits) -> list[list[int]]:
    """`prompt`: a string, a list of strings, a list of token ids, or a list of those."""
    p = body.get("prompt")
    if p is None:
        raise ApiError("'prompt' is required", "prompt")
    if isinstance(p, str):
        items: list = [p]
    elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        items = [p]
    elif isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
        items = p
    else:
        raise ApiError("'prompt' must be a string, a list of strings, or token ids", "prompt")
    out = []
    for x in items:
        if isinstance(x, str):
            ids = tokenizer.encode(x)
        elif all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < limits.vocab_size for t in x):
            ids = list(x)
        else:
            raise ApiError(f"token ids must be integers in [0, {limits.vocab_size})", "prompt")
        if not ids:
            raise ApiError("'prompt' is empty (no tokens)", "prompt")
        if len(ids) >= limits.max_len:
            raise ApiError(f"the prompt has {len(ids)} tokens; the context holds {limits.max_len} tokens "
                           "(prompt + completion)", "prompt", code="context_length_exceeded")
        out.append(ids)
    return out


def parse_completion(body: Any, tokenizer: Any, limits: ServerLimits,
                     prompts: Optional[list[list[int]]] = None) -> CompletionParams:
    """Check a /v1/completions body (or a chat body, whose rendered `prompts` are given).

    `max_tokens` defaults to the rest of the context (the longest prompt's). `user` is accepted
    and ignored; a parameter that would change the output and is not supported gets a 400.

    Raises:
        ApiError: naming the offending parameter.
    """
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise ApiError("'model' is required", "model")
    if model != limits.model_name:
        raise ApiError(f"the model {model!r} does not exist; this server serves {limits.model_name!r}",
                       "model", code="model_not_found")
    sampling = check_sampling(body, limits)
    for name, default in (("n", 1), ("best_of", 1)):
        if _number(body, name, default, int) != default:
            raise ApiError(f"'{name}' other than 1 is not supported", name)
    for name in ("logprobs", "top_logprobs", "suffix"):
        if body.get(name) not in (None, False):
            raise ApiError(f"'{name}' is not supported", name)
    if body.get("echo"):
        raise ApiError("'echo' is not supported", "echo")
    for name in ("presence_penalty", "frequency_penalty"):  # 0 is no penalty: what every request gets
        if _number(body, name, 0, float) != 0:
            raise ApiError(f"'{name}' other than 0 is not supported", name)
    if body.get("logit_bias"):
        raise ApiError("'logit_bias' is not supported", "logit_bias")
    ids = prompts if prompts is not None else prompt_ids(body, tokenizer, limits)
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    longest = max(len(x) for x in ids)
    max_tokens = _number(body, name, limits.max_len - longest, int)
    if max_tokens <= 0:
        raise ApiError(f"'{name}' must be >= 1, got {max_tokens}", name)
    if longest + max_tokens > limits.max_len:
        raise ApiError(f"'{name}' {max_tokens} with a prompt of {longest} tokens exceeds the context of "
                       f"{limits.max_len} tokens", name, code="context_length_exceeded")
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(f"'stop' must be a non-empty string or a list of up to {MAX_STOPS} of them", "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError("'stream' must be a boolean", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError("'stream_options' must be an object", "stream_options")
    return CompletionParams(ids, int(max_tokens), stream, stops, bool(opts.get("include_usage")), sampling)


class TextStream:
    """One completion's text, streamed: each character exactly once, cut at the first stop string.

    Text is decoded from all tokens so far (byte-level pieces decode correctly only together);
    a trailing incomplete character, and with stop strings the last `max(len(stop)) - 1`
    characters, are held back until more tokens or the end show what they are.
    """

    def __init__(self, tokenizer: Any, stops: list[str]) -> None:
        self.tok, self.stops = tokenizer, stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already handed out
        self.stopped = False  # a stop string was found: the completion ends there

    def push(self, tokens: list[int], final: bool = False) -> str:
        """Add committed tokens; returns the new text that is safe to send (maybe '')."""
        if self.stopped:
            return ""
        self.ids.extend(tokens)
        text = self.tok.decode(self.ids)
        end = len(text)
        if self.stops:
            start = max(0, self.sent - self.hold)
            hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                self.stopped, end = True, min(hits)
        if not self.stopped and not final:
            end = len(text.rstrip("\ufffd")) - self.hold if self.stops else len(text.rstrip("\ufffd"))
        piece = text[self.sent:max(end, self.sent)]
        self.sent = max(end, self.sent)
        return piece

    def finish_reason(self, engine_reason: Optional[str]) -> str:
        """OpenAI's finish reason: "stop" (a stop string or EOS) or "length"."""
        return "stop" if self.stopped else FINISH.get(engine_reason or "", "stop")
