"""The embedded local Ray listens on loopback only: every TCP/UDP listener of every process the
shared session started (GCS, raylet, agents, metrics servers, workers, the driver's core worker)
is bound to 127.0.0.0/8 or ::1; and init_ray's host choice reaches ray.init as intended."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pytest

from specdepth.adaptive.replicas import ray_local
from specdepth.adaptive.replicas.ray_local import init_ray, is_loopback

# Servers that must be seen listening before the check counts: the core processes, the agents,
# the autoscaler's and the dashboard's metrics servers, and a worker (named ray::<Actor>).
REQUIRED = ("gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "monitor.py",
            "dashboard.py", "ray::_Probe")


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("::ffff:127.0.0.1", True), ("0.0.0.0", False), ("::", False), ("192.0.2.2", False),
    ("fd00::2", False), ("example.org", False),
])
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


@pytest.mark.parametrize("host, env, node_ip, single_machine", [
    (None, None, "127.0.0.1", True),  # default: loopback, in Ray's single-machine mode
    (None, "localhost", "127.0.0.1", True),
    (None, "192.0.2.7", "192.0.2.7", False),  # SPECDEPTH_RAY_HOST opts into exposure
    ("192.0.2.8", "192.0.2.7", "192.0.2.8", False),  # the argument beats the variable
    ("0.0.0.0", None, None, False),  # wildcard: Ray picks the routable address
])
def test_init_ray_host_choice(monkeypatch: pytest.MonkeyPatch, host: str | None, env: str | None,
                              node_ip: str | None, single_machine: bool) -> None:
    """Which node IP ray.init gets, and whether single-machine mode is on only during the call."""
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants

    seen: dict[str, Any] = {}

    def fake_init(**kwargs: Any) -> None:
        seen.update(kwargs, single_machine=not ray_constants.ENABLE_RAY_CLUSTER)

    before = ray_constants.ENABLE_RAY_CLUSTER
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if env is None:
        monkeypatch.delenv(ray_local.HOST_ENV, raising=False)
    else:
        monkeypatch.setenv(ray_local.HOST_ENV, env)
    assert init_ray(num_cpus=1, host=host) is True
    assert seen.get("_node_ip_address") == node_ip
    assert seen["address"] == "local" and seen["include_dashboard"] is False
    assert seen["single_machine"] is (single_machine or not before)
    assert ray_constants.ENABLE_RAY_CLUSTER == before


def _listeners(proc: Any) -> list[tuple[str, int]]:
    """(address, port) of each listening TCP socket and bound, unconnected UDP socket."""
    import psutil

    out = []
    for conn in proc.net_connections(kind="inet"):
        listening = conn.status == psutil.CONN_LISTEN
        bound_udp = conn.type == socket.SOCK_DGRAM and conn.laddr and not conn.raddr
        if listening or bound_udp:
            out.append((conn.laddr.ip, conn.laddr.port))
    return out


def _ray_processes(session_dir: str) -> list[Any]:
    """The driver's descendants that this Ray instance started: those whose command line
    names the session folder (GCS, raylet, monitors, dashboard), and everything under them
    (workers and agents under the raylet)."""
    import psutil

    found: dict[int, Any] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if session_dir in " ".join(proc.cmdline()):
                found[proc.pid] = proc
                found.update((child.pid, child) for child in proc.children(recursive=True))
        except psutil.Error:
            continue
    return list(found.values())


def _name(proc: Any) -> str:
    """A readable process name: the script for Python processes (monitor.py, dashboard.py)."""
    name, args = proc.name(), proc.cmdline()
    if name.startswith("python"):
        return next((a.rsplit("/", 1)[-1] for a in args[1:] if a.endswith(".py")), name)
    return name


def test_every_embedded_ray_listener_is_loopback(ray_session) -> None:
    ray = ray_session
    exposed_on_purpose = not is_loopback(os.environ.get(ray_local.HOST_ENV) or "localhost")
    if os.environ.get("RAY_ADDRESS") or exposed_on_purpose:
        pytest.skip("the shared session joined a cluster or was exposed on purpose")
    import psutil

    @ray.remote(num_cpus=0)
    class _Probe:  # a worker process with its own gRPC server
        def ping(self) -> int:
            return os.getpid()

    probe = _Probe.remote()
    try:
        ray.get(probe.ping.remote(), timeout=120)
        from ray.core.generated.common_pb2 import Address

        worker = ray._private.worker.global_worker
        node = worker.node
        driver_port = Address.FromString(worker.core_worker.get_owner_address(ray.put(0))).port
        session_dir = node.get_session_dir_path()

        # Metrics servers and agents come up asynchronously: poll until every required server
        # has been seen listening, gathering every listener met on the way.
        seen: dict[tuple[str, int], set[tuple[str, int]]] = {}
        deadline = time.monotonic() + 60
        while True:
            for proc in _ray_processes(session_dir):
                try:
                    seen.setdefault((_name(proc), proc.pid), set()).update(_listeners(proc))
                except psutil.Error:
                    continue
            named = {name for (name, _), socks in seen.items() if socks}
            if all(r in named for r in REQUIRED) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        driver = [s for s in _listeners(psutil.Process()) if s[1] == driver_port]
        seen[("driver", os.getpid())] = set(driver)
    finally:
        ray.kill(probe)

    table = "\n".join(f"{name} pid={pid} {ip}:{port}"
                      for (name, pid), socks in sorted(seen.items()) for ip, port in sorted(socks))
    missing = [r for r in REQUIRED if not any(n == r and s for (n, _), s in seen.items())]
    assert not missing, f"never saw {missing} listening:\n{table}"
    assert driver, f"the driver's core worker port {driver_port} is not listening"
    exposed = [f"{name} pid={pid} {ip}:{port}" for (name, pid), socks in seen.items()
               for ip, port in socks if not is_loopback(ip)]
    assert not exposed, "listening beyond loopback:\n" + "\n".join(exposed) + f"\nall:\n{table}"
    assert node.node_ip_address == "127.0.0.1" and node.gcs_address.startswith("127.0.0.1:")
