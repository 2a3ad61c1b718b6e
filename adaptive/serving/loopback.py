"""Keep Ray Serve's per-replica gRPC server on loopback when Ray itself is.

Ray Serve 2.60 starts an inter-deployment gRPC server in every deployment replica, bound to
`[::]:0` (all interfaces) whatever the node's address; every other process of the embedded Ray
listens on 127.0.0.1 only (adaptive/replicas/ray_local.py). Peers reach that server at the node's IP, so
on a loopback node binding it to 127.0.0.1 loses nothing. Called from the deployment's
constructor, which Serve runs before it starts that server.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

log = logging.getLogger("specdepth.serve")
ANY_HOST = "[::]:"


def keep_replica_grpc_on_loopback() -> bool:
    """On a 127.0.0.1 node, make this replica's Serve gRPC server bind 127.0.0.1; True if done."""
    import ray
    from ray.serve._private import replica as serve_replica

    from specdepth.adaptive.replicas.ray_local import is_loopback

    if not is_loopback(ray.util.get_node_ip_address()):
        return False
    add: Callable[[Any, str], int] = getattr(serve_replica, "add_port_to_grpc_server", None)
    if add is None:  # another Serve version: nothing to narrow
        log.info("serve: no add_port_to_grpc_server in this Ray Serve; replica gRPC binding left as is")
        return False
    if getattr(add, "_specdepth_loopback", False):
        return True

    @functools.wraps(add)
    def on_loopback(server: Any, address: str) -> int:
        if address.startswith(ANY_HOST):
            address = "127.0.0.1:" + address[len(ANY_HOST):]
        return add(server, address)

    on_loopback._specdepth_loopback = True  # type: ignore[attr-defined]
    serve_replica.add_port_to_grpc_server = on_loopback
    return True
