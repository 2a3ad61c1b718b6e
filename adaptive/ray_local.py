"""Joining a Ray cluster, or starting the embedded local one."""

from __future__ import annotations

import os
from typing import Optional

import ray


def init_ray(address: Optional[str] = None, num_cpus: Optional[int] = None) -> bool:
    """Join a Ray cluster, or start an embedded local one.

    With `address` or RAY_ADDRESS set (as `ray job submit` does), join that cluster. Otherwise
    start a new local instance (never an unrelated `ray start` cluster that happens to run on this
    machine), with the dashboard (Ray's HTTP server) off and `num_cpus` CPUs (default: the
    machine's). Nothing here binds 0.0.0.0; Ray 2.60's core processes (GCS, raylet, workers)
    choose their own gRPC listen addresses, whatever ray.init is given.

    Returns:
        True when this call started a local instance (the caller may `ray.shutdown()` it).
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address)
        return False
    ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
             dashboard_host="127.0.0.1")
    return True
