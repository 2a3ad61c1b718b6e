"""The router: one thread that owns a `ClusterController` for the HTTP front.

The cluster is not thread-safe, so every call on it happens on this thread: HTTP handlers hand
submissions and cancellations over through a thread-safe queue, and hear back through the
callbacks they passed (`on_token` with each answer's committed tokens, `on_done` once with the
finished `RequestOutput`). Callbacks run on this thread; a handler living on an event loop wraps
them in `loop.call_soon_threadsafe`. The replicas run their own step loops; this thread only
takes their answers. A submission or cancellation wakes the exchanges in flight (`wake`), so it
reaches its replica within a round trip instead of waiting for the next answer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from specdepth.adaptive.engine import Request, RequestError, RequestOutput

log = logging.getLogger("specdepth.serve")
IDLE_WAIT_S = 0.05  # how long the idle thread blocks on its inbox before checking for shutdown

DoneFn = Callable[[RequestOutput], None]


@dataclass
class _Submit:
    req: Request
    on_done: DoneFn


@dataclass
class _Cancel:
    request_id: str


class Router:
    """Drives a cluster on a background thread; `submit` and `cancel` are safe from any thread."""

    def __init__(self, cluster: Any) -> None:
        """
        Args:
            cluster: a `ClusterController` (or anything with its submit/cancel/step/has_work/wake and
                `queue`/`seqs`); from now on only this router's thread touches it.
        """
        self.cluster = cluster
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.active: dict[str, tuple[RequestOutput, DoneFn]] = {}  # request id -> its output, callback
        self.pending = 0  # submitted and not yet done (read from other threads for admission)
        self.error: Optional[str] = None  # set when the cluster failed for good
        self.answers = 0  # cluster steps taken (each takes one replica answer)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="specdepth-router", daemon=True)
        self._thread.start()

    # ---- any thread -------------------------------------------------------------------------
    def submit(self, req: Request, on_done: DoneFn) -> None:
        """Queue `req`; its `on_token` and then `on_done` are called on the router thread.

        Raises:
            RuntimeError: the cluster has failed for good (no replica left) or the router stopped.
        """
        if self.error is not None or self._stop.is_set():
            raise RuntimeError(self.error or "the router has stopped")
        with self._lock:
            self.pending += 1
        self.inbox.put(_Submit(req, on_done))
        self.cluster.wake()

    def cancel(self, request_id: str) -> None:
        """End a request (a client went away); its `on_done` sees finish reason "cancelled"."""
        self.inbox.put(_Cancel(request_id))
        self.cluster.wake()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread (requests still running end as errors) and shut the cluster down."""
        self._stop.set()
        self._thread.join(timeout)
        try:
            self.cluster.shutdown()
        except Exception as e:  # noqa: BLE001 - Ray may already be going down
            log.info("router: cluster shutdown: %s", e)

    # ---- the router thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain(block=not self.cluster.has_work())
                if self.cluster.has_work():
                    self.cluster.step()
                    self.answers += 1
                    self._finish()
            except Exception as e:  # noqa: BLE001 - no replica left, or a bug: fail everyone, stop taking work
                log.exception("router: the cluster failed")
                self.error = f"the cluster failed: {type(e).__name__}: {e}"
                break
        self._fail_all(self.error or "the server is shutting down")

    def _drain(self, block: bool) -> None:
        """Apply every queued submission and cancellation (blocking briefly when idle)."""
        try:
            item = self.inbox.get(timeout=IDLE_WAIT_S) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(item, _Submit):
                self._submit(item)
            else:
                self._cancel(item.request_id)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _submit(self, item: _Submit) -> None:
        try:
            out = self.cluster.submit(item.req)
        except RequestError as e:
            out = RequestOutput(item.req.request_id, list(item.req.prompt_ids), finish_reason="error", error=e)
            self._done(item.req.request_id, out, item.on_done)
            return
        self.active[item.req.request_id] = (out, item.on_done)

    def _cancel(self, request_id: str) -> None:
        entry = self.active.get(request_id)
        if entry is None:
            return
        self.cluster.cancel(request_id)
        self._done(request_id, entry[0], entry[1])

    def _finish(self) -> None:
        """Requests the last answer finished leave, each with one `on_done`."""
        for rid, (out, on_done) in list(self.active.items()):
            if out.finish_reason is not None:
                self._done(rid, out, on_done)

    def _done(self, request_id: str, out: RequestOutput, on_done: DoneFn) -> None:
        self.active.pop(request_id, None)
        with self._lock:
            self.pending -= 1
        if out.finish_reason is None:
            out.finish_reason = "cancelled"
        if not out.t_done:
            out.t_done = time.perf_counter()
        try:
            on_done(out)
        except Exception:  # noqa: BLE001 - one handler's bug must not stop the router
            log.exception("router: on_done for %s failed", request_id)

    def _fail_all(self, why: str) -> None:
        """Every request still here (or still queued) ends with an error."""
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Submit):
                self.active[item.req.request_id] = (RequestOutput(item.req.request_id, list(item.req.prompt_ids)),
                                                    item.on_done)
        for rid, (out, on_done) in list(self.active.items()):
            if out.finish_reason is None:
                out.finish_reason, out.error = "error", RuntimeError(why)
            self._done(rid, out, on_done)
