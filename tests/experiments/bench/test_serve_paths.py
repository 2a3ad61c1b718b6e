"""The serve-paths benchmark's own parts (the benchmark itself runs servers: not in CI)."""

from __future__ import annotations

import socket
import subprocess
import sys

from specdepth.experiments.bench.serve_paths import PATHS, open_listeners


def test_a_listener_on_every_interface_is_seen_and_loopback_is_not() -> None:
    before = open_listeners()
    with socket.socket() as lo, socket.socket() as anywhere:
        lo.bind(("127.0.0.1", 0))
        lo.listen()
        anywhere.bind(("0.0.0.0", 0))
        anywhere.listen()
        new = open_listeners() - before
        assert [port for _, port in new] == [anywhere.getsockname()[1]]


def test_the_loopback_paths_keep_direct_ingress_off_and_a_bad_path_is_one_line() -> None:
    assert PATHS["throughput"]["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "0"  # else Ray 2.60 turns it on (0.0.0.0)
    out = subprocess.run([sys.executable, "-m", "specdepth.experiments.bench.serve_paths", "--paths", "fast"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "unknown path 'fast'" in out.stderr and "Traceback" not in out.stderr
