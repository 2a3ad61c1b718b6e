"""Streaming one HTTP request's completions: router callbacks in, text chunks and SSE out.

A `Job` submits its prompts to the router (`start`, in the handler, so the replica prefills while
the response is set up) and turns the tokens each answer carries (delivered on the router thread,
crossed to the handler's event loop with `call_soon_threadsafe`) into text, each character once;
`sse` frames that as OpenAI Server-Sent Events. Kept apart from the Serve
deployment class so that Ray pickles these by reference.
"""

import asyncio
import json
import time
from typing import Any, AsyncIterator, Optional

from fastapi import Request as HttpRequest

from specdepth.adaptive.engine import Request
from specdepth.adaptive.serving.protocol import ApiError, CompletionParams, TextStream


async def read_json(http: HttpRequest) -> Any:
    try:
        return json.loads(await http.body())
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(f"the request body is not valid JSON: {e}") from None


class Job:
    """One HTTP request's prompts in flight: the router's callbacks feed one asyncio queue."""

    def __init__(self, server: Any, cid: str, params: CompletionParams) -> None:
        self.server, self.cid, self.params = server, cid, params
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.streams = [TextStream(server.tok, params.stop) for _ in params.prompts]
        self.finish: list[Optional[str]] = [None] * len(params.prompts)
        self.error: Optional[str] = None
        self.ids = [f"{cid}-{i}" for i in range(len(params.prompts))]  # the router's request ids

    def _put(self, item: tuple) -> None:
        """From the router thread; never raises into the router (a closed loop: dropped)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            pass

    def start(self) -> None:
        """Submit every prompt now, before the response starts (the replica prefills meanwhile).

        Raises:
            ApiError: 503, the router cannot take work (what was submitted is cancelled).
        """
        router, ids = self.server.router, self.ids
        for i, prompt in enumerate(self.params.prompts):
            req = Request(ids[i], prompt, self.params.max_tokens,
                          on_token=lambda rid, toks, i=i: self._put((i, "tokens", list(toks))),
                          sampling=self.params.sampling)
            try:
                router.submit(req, lambda out, i=i: self._put((i, "done", out)))
            except RuntimeError as e:
                for rid in ids[:i]:
                    router.cancel(rid)
                raise ApiError(f"the server cannot serve: {e}", status=503, type_="server_error") from None

    async def events(self) -> AsyncIterator[tuple[int, str, Optional[str]]]:
        """(prompt index, new text, finish reason or None) as the replicas commit tokens.

        Leaving early (the client went away, or this task was cancelled) cancels what still runs.
        """
        router, ids = self.server.router, self.ids
        left = len(ids)
        try:
            while left:
                i, kind, payload = await self.queue.get()
                if self.finish[i] is not None:
                    continue
                s = self.streams[i]
                if kind == "tokens":
                    piece = s.push(payload)
                    if s.stopped:  # a stop string: the completion ends here
                        router.cancel(ids[i])
                        self.finish[i], left = "stop", left - 1
                else:
                    piece = s.push([], final=True)
                    self._done(i, payload)
                    left -= 1
                if piece or self.finish[i] is not None:
                    yield i, piece, self.finish[i]
        finally:
            for i, rid in enumerate(ids):
                if self.finish[i] is None:
                    router.cancel(rid)

    def _done(self, i: int, out: Any) -> None:
        s = self.streams[i]
        if out.finish_reason == "error":
            self.error = str(out.error)
        self.finish[i] = s.finish_reason(out.finish_reason)
        ttft = out.t_first - out.t_submit if out.t_first else None
        self.server.metrics.done(out.finish_reason or "unknown", self.server.router.pending, ttft)


async def sse(job: Job, chat: bool) -> AsyncIterator[str]:
    """Server-Sent Events: one chunk per answer's new text per prompt, then finish chunks, [DONE]."""
    model, created = job.server.limits.model_name, int(time.time())

    def chunk(i: int, text: Optional[str], finish: Optional[str]) -> str:
        if chat:
            delta = {"content": text} if text else {}
            choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": i, "text": text or "", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        return "data: " + json.dumps({"id": job.cid, "object": obj, "created": created, "model": model,
                                      "choices": [choice]}) + "\n\n"

    if chat:
        for i in range(len(job.params.prompts)):
            yield "data: " + json.dumps({"id": job.cid, "object": "chat.completion.chunk", "created": created,
                                         "model": model, "choices": [{"index": i, "delta": {"role": "assistant"},
                                                                      "logprobs": None, "finish_reason": None}]}) + "\n\n"
    try:
        async for i, piece, finish in job.events():
            yield chunk(i, piece, finish)
    except ApiError as e:
        yield "data: " + json.dumps(e.body()) + "\n\n"
    if job.error is not None:
        yield "data: " + json.dumps(ApiError(f"generation failed: {job.error}", status=500,
                                             type_="server_error").body()) + "\n\n"
    elif job.params.include_usage:
        n_prompt = sum(len(p) for p in job.params.prompts)
        n_out = sum(len(s.ids) for s in job.streams)
        yield "data: " + json.dumps({"id": job.cid, "object": "chat.completion.chunk" if chat else "text_completion",
                                     "created": created, "model": model, "choices": [],
                                     "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                               "total_tokens": n_prompt + n_out}}) + "\n\n"
    yield "data: [DONE]\n\n"
