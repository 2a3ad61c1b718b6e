"""`specdepth serve`: an OpenAI-compatible HTTP server (Ray Serve) over adaptive speculative decoding.

    specdepth serve                                   # bundled pair on http://127.0.0.1:8000/v1
    specdepth serve --target ./Qwen2.5-7B --draft ./Qwen2.5-0.5B --replicas 2 --port 8080

Joins RAY_ADDRESS (an existing cluster) or starts an embedded local Ray that listens on 127.0.0.1
only. The HTTP front binds --host (127.0.0.1 unless told otherwise): by default this process serves
HTTP itself (`--front direct`: uvicorn, the router and the cluster's controller here, the engine
replicas Ray actors); `--front serve` puts it behind Ray Serve's proxy and an ingress replica.
Prints one line with the URL on stderr once the replicas are up; nothing goes to stdout. SIGINT or
SIGTERM drains the requests in flight (up to 30 s), stops the front, and stops the Ray it started.
For an existing cluster, `serve run experiments/serve_config.yaml` deploys the same application.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading

from specdepth.experiments.cli.argtypes import float_range, int_range, non_negative_int, positive_int
from specdepth.experiments.cli.generate import MAX_DEPTH_LIMIT, add_compile_arg, add_drafter_args, add_model_args

APP_NAME = "specdepth"
DRAIN_S = 30.0  # how long SIGINT/SIGTERM waits for requests in flight
STREAM_MS = 50.0  # --stream-ms (ServeOptions.stream_s)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve an OpenAI-compatible HTTP API (Ray Serve)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=positive_int, default=1, help="engine replicas (Ray actors, one pair each)")
    p.add_argument("--policy", default="dspark", help="depth policy spec (see `specdepth policies`)")
    p.add_argument("--max-batch", type=positive_int, default=16, help="sequences one replica runs at once")
    p.add_argument("--max-depth", type=int_range(0, MAX_DEPTH_LIMIT), default=8, help="K: largest draft budget")
    p.add_argument("--cost", default="auto", help="cost model: auto (profile the pair once, cached), a profile "
                   "JSON, h200, fixed:target_ms=..,draft_ms=..")
    p.add_argument("--host", default="127.0.0.1", help="address the HTTP front binds (default loopback only)")
    p.add_argument("--front", choices=("direct", "serve"), default="direct",
                   help="who serves HTTP: this process (direct, one hop to the replicas) or Ray Serve's proxy "
                        "and an ingress replica (serve)")
    p.add_argument("--port", type=int_range(1, 65535), default=8000)
    p.add_argument("--model-name", default=None,
                   help="the model name clients send (default: specdepth-bundled, or the target's name)")
    p.add_argument("--max-queue", type=positive_int, default=None,
                   help="requests admitted at once; beyond it 429 (default 4 x replicas x max-batch)")
    p.add_argument("--stream-ms", type=float_range(0.0), default=STREAM_MS,
                   help="a replica sends committed tokens at most this often (first tokens and finishes at once)")
    p.add_argument("--temperature", type=float_range(0.0), default=0.0,
                   help="the replicas' sampling temperature, for every request (0 = greedy)")
    p.add_argument("--top-p", type=float_range(0.0, 1.0, lo_open=True), default=1.0)
    p.add_argument("--seed", type=non_negative_int, default=0, help="sampling seed (replica i uses seed + i)")
    p.add_argument("--ray-host", default=None, metavar="ADDRESS",
                   help="the address the embedded Ray listens on (default 127.0.0.1, or SPECDEPTH_RAY_HOST)")
    add_model_args(p)
    add_drafter_args(p)
    add_compile_arg(p)
    p.set_defaults(func=run)


def _options(args: argparse.Namespace):
    from specdepth.adaptive.serving.setup import ServeOptions
    if args.cost != "auto":
        from specdepth.adaptive.cost.model import parse_cost
        parse_cost(args.cost)  # a typo fails before anything starts
    from specdepth.policies.registry import make_policy
    if getattr(make_policy(args.policy), "replay_only", False):
        raise ValueError(f"--policy {args.policy}: needs the future (true match lengths): replay only")
    return ServeOptions(target=args.target, draft=args.draft, replicas=args.replicas, policy=args.policy,
                        max_batch=args.max_batch, max_depth=args.max_depth, cost=args.cost,
                        model_name=args.model_name, max_queue=args.max_queue,
                        stream_s=args.stream_ms / 1000, temperature=args.temperature, top_p=args.top_p,
                        seed=args.seed, device=args.device or "auto", threads=args.threads, compile=args.compile,
                        drafter=args.drafter, ngram_min=args.ngram_min, ngram_max=args.ngram_max)


def _check_port(host: str, port: int) -> None:
    """Raises ValueError when (host, port) cannot be bound (in use, or not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ValueError(f"--host {host} --port {port}: cannot listen there: {e.strerror or e}") from None


def run(args: argparse.Namespace) -> int:
    if (args.target is None) != (args.draft is None):
        raise ValueError("--target and --draft go together: give both, or neither (the bundled pair)")
    opts = _options(args)
    _check_port(args.host, args.port)
    # Ray forwards its workers' log lines to the driver's stdout: stdout carries nothing of ours,
    # so point it at stderr for good
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    import ray
    from ray import serve

    from specdepth.adaptive.replicas.ray_local import init_ray
    from specdepth.adaptive.serving.app import SpecdepthServer

    stop, ready = threading.Event(), threading.Event()

    def on_signal(signum: int, frame) -> None:
        stop.set()
        if not ready.is_set():  # still starting: interrupt it, then clean up
            raise KeyboardInterrupt

    # Ray's and Serve's INFO lines (a local instance started, replicas added, each request) would
    # bury the one line that matters; warnings and errors still show
    started = init_ray(host=args.ray_host)
    for name in ("ray", "ray.serve"):  # after ray.init, which sets their levels
        logging.getLogger(name).setLevel(logging.WARNING)
    # after ray.init, which installs handlers of its own that would exit without cleaning up
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if started:
            _check_resources(ray, opts.replicas)
        if args.front == "direct":
            return _run_direct(args, opts, stop, ready)
        quiet = {"log_level": "WARNING"}
        serve.start(http_options={"host": args.host, "port": args.port}, logging_config=quiet)
        serve.run(SpecdepthServer.bind(opts), name=APP_NAME, route_prefix="/", blocking=False, logging_config=quiet)
        ready.set()
        _say_ready(args, opts)
        while not stop.wait(0.5):
            pass
        print("specdepth serve: draining and shutting down", file=sys.stderr, flush=True)
        _drain(serve)
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, signal.SIG_IGN if s == signal.SIGTERM else h)
        if args.front == "serve":
            _shutdown(serve, ray, started)
        elif started:
            ray.shutdown()
        for s, h in old.items():
            signal.signal(s, h)


def _say_ready(args: argparse.Namespace, opts) -> None:
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"specdepth serve: {opts.name} on http://{shown}:{args.port}/v1 "
          f"({opts.replicas} replica{'s' * (opts.replicas > 1)}, policy {opts.policy}); "
          "Ctrl-C or SIGTERM to stop", file=sys.stderr, flush=True)


def _run_direct(args: argparse.Namespace, opts, stop: threading.Event, ready: threading.Event) -> int:
    """Serve HTTP from this process: uvicorn's loop on a thread, the `Front` (router, cluster) here."""
    import asyncio

    import uvicorn

    from specdepth.adaptive.serving.app import Front, direct_app

    front = Front(opts)
    server = uvicorn.Server(uvicorn.Config(direct_app(front), host=args.host, port=args.port, log_level="warning",
                                           lifespan="off", access_log=False))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), name="http", daemon=True)
    try:
        thread.start()
        while not server.started:  # bound and listening, or failed to
            if not thread.is_alive():
                raise ValueError(f"--host {args.host} --port {args.port}: the HTTP server did not start")
            if stop.wait(0.05):
                break
        ready.set()
        if not stop.is_set():
            _say_ready(args, opts)
        while not stop.wait(0.5):
            if not thread.is_alive():
                print("specdepth serve: the HTTP server stopped", file=sys.stderr, flush=True)
                return 1
        print("specdepth serve: draining and shutting down", file=sys.stderr, flush=True)
        try:
            left = asyncio.run_coroutine_threadsafe(front.drain(DRAIN_S), loop).result(DRAIN_S + 10)
        except Exception as e:  # noqa: BLE001 - shutting down regardless
            print(f"specdepth serve: drain: {type(e).__name__}: {e}", file=sys.stderr)
            left = 0
        if left:
            print(f"specdepth serve: {left} requests still running after {DRAIN_S:.0f} s; cutting them",
                  file=sys.stderr)
        return 0
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        front.router.stop()


def _check_resources(ray, replicas: int) -> None:
    """An embedded Ray that cannot hold every replica would wait for them forever: refuse instead.

    Raises:
        ValueError: naming --replicas and what each replica needs (one CPU; one GPU where there are GPUs).
    """
    res = ray.cluster_resources()
    need = {"CPU": replicas, **({"GPU": replicas} if res.get("GPU", 0) > 0 else {})}
    short = [f"{n:g} {kind}s (this machine's Ray has {res.get(kind, 0):g})" for kind, n in need.items()
             if res.get(kind, 0) < n]
    if short:
        raise ValueError(f"--replicas {replicas} needs " + " and ".join(short) + ": one per replica")


def _drain(serve) -> None:
    """New requests get 503; wait up to DRAIN_S for those in flight to finish."""
    try:
        left = serve.get_app_handle(APP_NAME).drain.remote(DRAIN_S).result(timeout_s=DRAIN_S + 10)
    except Exception as e:  # noqa: BLE001 - shutting down regardless
        print(f"specdepth serve: drain: {type(e).__name__}: {e}", file=sys.stderr)
        return
    if left:
        print(f"specdepth serve: {left} requests still running after {DRAIN_S:.0f} s; cutting them",
              file=sys.stderr)


def _shutdown(serve, ray, started: bool) -> None:
    """Drain and stop: Serve waits for requests in flight (graceful_shutdown_timeout_s); the whole
    Serve instance and the embedded Ray go when this process started them, only our application
    when it joined a cluster."""
    try:
        if started:
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
    except Exception as e:  # noqa: BLE001 - going down anyway; say why, then stop Ray
        print(f"specdepth serve: serve shutdown: {type(e).__name__}: {e}", file=sys.stderr)
    if started:
        ray.shutdown()
