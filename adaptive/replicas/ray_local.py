"""Joining a Ray cluster, or starting the embedded local one on loopback only.

Ray 2.60 binds every server of a node to loopback exactly when the node's IP address is
127.0.0.1: the GCS, the raylet and each core worker pass `node_ip == "127.0.0.1"` to their gRPC
server as its listen-to-localhost flag (otherwise they bind the wildcard, `[::]`), and the
dashboard agent (gRPC and HTTP), the runtime-env agent, and the autoscaler's and the dashboard's
metrics servers bind the node IP or 127.0.0.1 likewise. On Linux, though, `ray.init` turns a
loopback `_node_ip_address` into the machine's routable address, unless Ray's single-machine
mode (`ray_constants.ENABLE_RAY_CLUSTER` false, the `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`
default on macOS and Windows) is on. So the embedded Ray is started with that mode on, for the
duration of `ray.init` only, and with the node IP 127.0.0.1: every process it starts then
listens on 127.0.0.1 (IPv4, or IPv4-mapped `::ffff:127.0.0.1` on gRPC's dual-stack sockets).
tests/adaptive/replicas/test_ray_local.py checks every listener of every process it starts.

Opting into exposure (`host`, or SPECDEPTH_RAY_HOST) gives Ray a routable node IP: Ray then
binds its gRPC servers on all interfaces, as a `ray start` node does, guarded by Ray's token
authentication, which a new local `ray.init` turns on unless RAY_AUTH_MODE says otherwise.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from typing import Iterator, Optional

import ray

LOOPBACK = "127.0.0.1"  # the one node IP for which Ray's C++ servers bind loopback only
HOST_ENV = "SPECDEPTH_RAY_HOST"  # opt-in: the address the embedded Ray is exposed on
_WILDCARDS = ("0.0.0.0", "::", "*")  # "all interfaces": let Ray pick its routable node IP


def is_loopback(host: str) -> bool:
    """True for `localhost`, 127.0.0.0/8, ::1 and IPv4-mapped loopback (`::ffff:127.0.0.1`)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip().strip("[]"))
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@contextlib.contextmanager
def _single_machine_mode() -> Iterator[None]:
    """Ray's macOS/Windows single-machine mode while a local node starts: its node IP stays
    127.0.0.1 instead of being resolved to the machine's routable address."""
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def init_ray(address: Optional[str] = None, num_cpus: Optional[int] = None,
             host: Optional[str] = None) -> bool:
    """Join a Ray cluster, or start an embedded local one that listens on loopback only.

    With `address` or RAY_ADDRESS set (as `ray job submit` does), join that cluster. Otherwise
    start a new local instance (never an unrelated `ray start` cluster that happens to run on this
    machine), with the dashboard (Ray's HTTP server) off and `num_cpus` CPUs (default: the
    machine's), whose processes all listen on 127.0.0.1 (see the module docstring).

    Args:
        address: a cluster to join; None reads RAY_ADDRESS.
        num_cpus: CPUs of the embedded instance; None means the machine's.
        host: the address to expose the embedded instance on; None reads SPECDEPTH_RAY_HOST,
            and unset or a loopback address means 127.0.0.1 only. A wildcard (0.0.0.0, ::)
            lets Ray choose the machine's routable address. Ignored when joining a cluster.

    Returns:
        True when this call started a local instance (the caller may `ray.shutdown()` it).
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address)
        return False
    host = (host or os.environ.get(HOST_ENV) or LOOPBACK).strip()
    # workers at the driver's priority: Ray's default (nice 15) lets every other process on the
    # machine preempt the replicas' model passes
    common = dict(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
                  dashboard_host=LOOPBACK, _system_config={"worker_niceness": 0})
    if is_loopback(host):
        with _single_machine_mode():
            ray.init(_node_ip_address=LOOPBACK, **common)
    elif host in _WILDCARDS:
        ray.init(**common)
    else:
        ray.init(_node_ip_address=host, **common)
    return True
