"""The OpenAI-compatible HTTP front: the same handlers served two ways.

`Front` owns a `ClusterController` driven by a `Router` thread; the engine replicas are the
cluster's `ReplicaActor`s, each running its own step loop on a thread of its own. A request's
committed tokens arrive on the router thread (`on_token`) and cross to the handler's event loop
through a per-request `asyncio.Queue`; each answer's tokens for a request leave as one SSE chunk.
A client that goes away cancels its requests (its slot frees within a step).

- `direct_app(front)`: a FastAPI app on `front`'s bound handlers, which `specdepth serve` runs under
  uvicorn in its own process (the default front): a request crosses one process boundary, to the
  replica actor.
- `SpecdepthServer`: the same class as a Ray Serve ingress deployment (`--front serve`, and
  `serve run experiments/serve_config.yaml`): Serve's proxy, then the ingress replica, then the
  engine replica.

Endpoints: POST /v1/completions, POST /v1/chat/completions (HF pairs with a chat template),
GET /v1/models, GET /health, GET /debug/replicas (replica pids, for fault tests).
`build_app(args)` is the builder that `serve run experiments/serve_config.yaml` calls.
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations as objects
import asyncio
import logging
import time
import uuid
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request as HttpRequest
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from specdepth.adaptive.serving.loopback import keep_replica_grpc_on_loopback
from specdepth.adaptive.serving.protocol import ApiError, CompletionParams, ServerLimits, parse_completion, prompt_ids
from specdepth.adaptive.serving.router import Router
from specdepth.adaptive.serving.setup import ServeOptions, build_cluster, chat_renderer
from specdepth.workers.bundled import load_tokenizer
from specdepth.adaptive.serving.stream import Job, read_json, sse
from specdepth.workers.sampler import SamplingParams

log = logging.getLogger("specdepth.serve")
RETRY_AFTER_S = 1  # what a 429 tells the client to wait
api = FastAPI(title="specdepth")


def _error(e: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if e.status in (429, 503) else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


class _Metrics:
    """The front's own Prometheus series (the cluster exports the per-replica ones)."""

    def __init__(self) -> None:
        try:
            from ray.util import metrics as m
            self.pending = m.Gauge("specdepth_serve_queue_length", "requests admitted and not finished")
            self.requests = m.Counter("specdepth_serve_requests_total", "completions requests by outcome",
                                      ("outcome",))
            self.ttft = m.Histogram("specdepth_serve_ttft_seconds", "time to the first committed token",
                                    [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10])
        except Exception as e:  # noqa: BLE001 - metrics are optional
            log.info("serve metrics off: %s", e)
            self.pending = None

    def done(self, outcome: str, pending: int, ttft: Optional[float]) -> None:
        if self.pending is None:
            return
        try:
            self.pending.set(pending)
            self.requests.inc(1, {"outcome": outcome})
            if ttft is not None:
                self.ttft.observe(ttft)
        except Exception:  # noqa: BLE001 - never fail a request for a metric
            self.pending = None


class Front:
    """The HTTP handlers: check requests, admit them (bounded), stream their committed text."""

    def __init__(self, options: ServeOptions) -> None:
        self.opts = options
        self.tok = load_tokenizer(options.target)
        self.chat = chat_renderer(options.target)
        cluster = build_cluster(options)
        self.limits = ServerLimits(options.name, cluster.max_len, cluster.vocab_size,
                                   SamplingParams(options.temperature, options.top_p))
        self.router = Router(cluster)
        self.metrics = _Metrics()
        self.created = int(time.time())
        self.open = 0  # HTTP responses in progress (a stream counts until its last chunk)
        self.draining = False  # shutting down: new requests get 503

    def __del__(self) -> None:
        router = getattr(self, "router", None)
        if router is not None:
            router.stop()

    def check_health(self) -> None:
        """Serve's health check: a cluster that failed for good makes this replica unhealthy."""
        if self.router.error is not None:
            raise RuntimeError(self.router.error)

    async def drain(self, timeout_s: float = 30.0) -> int:
        """Refuse new requests (503) and wait for the ones in progress to end; returns how many
        had not ended after `timeout_s` (what `specdepth serve` calls on SIGTERM)."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while (self.open or self.router.pending) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the last chunks on their way through the proxy
        return self.open + self.router.pending

    # ---- small endpoints --------------------------------------------------------------------
    def health(self) -> JSONResponse:
        if self.router.error is not None:
            return JSONResponse({"status": "error", "error": self.router.error}, status_code=503)
        return JSONResponse({"status": "ok"})

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.limits.model_name, "object": "model", "created": self.created,
                                            "owned_by": "specdepth", "max_model_len": self.limits.max_len}]}

    def replicas(self) -> list:
        return [{"replica": r.rid, "pid": r.pid, "alive": r.alive, "running": len(r.seqs), "failures": r.failures}
                for r in list(self.router.cluster.replicas)]

    # ---- completions ------------------------------------------------------------------------
    async def completions(self, http: HttpRequest) -> Any:
        try:
            body = await read_json(http)
            return await self._serve(parse_completion(body, self.tok, self.limits), chat=False)
        except ApiError as e:
            return _error(e)

    async def chat_completions(self, http: HttpRequest) -> Any:
        try:
            body = await read_json(http)
            if self.chat is None:
                raise ApiError(f"the model {self.limits.model_name!r} has no chat template (its tokenizer config "
                               "names none): use /v1/completions", "messages", code="no_chat_template")
            msgs = body.get("messages") if isinstance(body, dict) else None
            if not isinstance(msgs, list) or not msgs or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in msgs):
                raise ApiError("'messages' must be a non-empty list of {role, content} strings", "messages")
            try:
                prompt = self.chat(msgs)
            except Exception as e:  # noqa: BLE001 - the template's own raise_exception or a render error
                raise ApiError(f"the chat template refused these messages: {e}", "messages") from None
            ids = prompt_ids({"prompt": prompt}, self.tok, self.limits)
            return await self._serve(parse_completion(body, self.tok, self.limits, prompts=ids), chat=True)
        except ApiError as e:
            return _error(e)

    async def _serve(self, params: CompletionParams, chat: bool) -> Any:
        if self.router.error is not None:
            raise ApiError(f"the server cannot serve: {self.router.error}", status=503, type_="server_error")
        if self.draining:
            raise ApiError("the server is shutting down", status=503, type_="server_error", code="shutting_down")
        if self.router.pending + len(params.prompts) > self.opts.queue_limit:
            raise ApiError(f"the server is at capacity ({self.opts.queue_limit} requests); retry after "
                           f"{RETRY_AFTER_S} s", status=429, type_="rate_limit_error", code="server_busy")
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        job = Job(self, cid, params)
        job.start()
        self.open += 1
        if params.stream:
            return StreamingResponse(self._counted(sse(job, chat)), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        texts = [""] * len(params.prompts)
        try:
            async for i, piece, _ in job.events():
                texts[i] += piece
        finally:
            self.open -= 1
        if job.error is not None:
            raise ApiError(f"generation failed: {job.error}", status=500, type_="server_error")
        n_prompt = sum(len(p) for p in params.prompts)
        n_out = sum(len(s.ids) for s in job.streams)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": job.finish[i]}
                       for i, t in enumerate(texts)]
        else:
            choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": job.finish[i]}
                       for i, t in enumerate(texts)]
        return {"id": cid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.limits.model_name, "choices": choices, "usage": usage}

    async def _counted(self, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        """A stream that counts as open (for `drain`) until its last chunk."""
        try:
            async for c in chunks:
                yield c
        finally:
            self.open -= 1


ROUTES = (("GET", "/health", "health"), ("GET", "/v1/models", "models"), ("GET", "/debug/replicas", "replicas"),
          ("POST", "/v1/completions", "completions"), ("POST", "/v1/chat/completions", "chat_completions"))
for _method, _path, _name in ROUTES:  # Serve's ingress binds these to the deployment's instance
    api.add_api_route(_path, getattr(Front, _name), methods=[_method])


def direct_app(front: Front) -> FastAPI:
    """A FastAPI app on `front`'s handlers, to run in the process that holds it (uvicorn)."""
    app = FastAPI(title="specdepth")
    for method, path, name in ROUTES:
        app.add_api_route(path, getattr(front, name), methods=[method])
    return app


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096,
                  graceful_shutdown_timeout_s=30, graceful_shutdown_wait_loop_s=0.5,
                  health_check_period_s=5)
@serve.ingress(api)
class SpecdepthServer(Front):
    """`Front` as a Ray Serve ingress replica."""

    def __init__(self, options: ServeOptions) -> None:
        keep_replica_grpc_on_loopback()  # before Serve starts this replica's gRPC server
        super().__init__(options)


def build_app(args: Optional[dict] = None) -> Any:
    """The Serve application for `ServeOptions(**args)` (what `serve run` / `serve deploy` call)."""
    return SpecdepthServer.bind(ServeOptions.from_args(args))
