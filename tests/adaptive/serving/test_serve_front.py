"""`specdepth serve --front serve`: the same handlers behind Ray Serve's proxy and an ingress
replica (test_serve.py runs the default front, HTTP served by the `specdepth serve` process).

One server with one replica: a greedy completion equals `specdepth generate`'s, every listener of
its process tree is on loopback, and SIGTERM drains it and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.adaptive.serving.test_serve import (COST, MODEL, PROMPTS, _descendants, _listening, _post, launch, stop,
                                               wait_ready)

pytest.importorskip("openai")


def test_the_ray_serve_front_answers_as_generate_on_loopback_and_drains():
    from specdepth.adaptive.replicas.ray_local import is_loopback
    from specdepth.workers.bundled import load_tokenizer
    prompt, n = PROMPTS[1], 16
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write(json.dumps({"prompt": prompt}) + "\n")
    gen = subprocess.run([sys.executable, "-m", "specdepth.experiments.cli.main", "generate", "--prompts", f.name,
                          "--max-new-tokens", str(n), "--cost", COST, "--json"], capture_output=True, text=True,
                         timeout=120)
    os.unlink(f.name)
    assert gen.returncode == 0, gen.stderr
    expected = load_tokenizer(None).decode(json.loads(gen.stdout)["token_ids"])
    proc, base, log = launch("--front", "serve")
    try:
        wait_ready(proc, log)
        status, _, body = _post(base, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": n,
                                                          "temperature": 0})
        assert status == 200 and body["choices"][0]["text"] == expected
        listening = _listening()
        wide = []
        for pid in {proc.pid, *_descendants(proc.pid)}:
            try:
                links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
            except OSError:
                continue
            inodes = [int(link[8:-1]) for link in links if link.startswith("socket:[")]
            wide += [listening[i] for i in inodes if i in listening and not is_loopback(listening[i])]
        assert listening and wide == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
    finally:
        stop(proc, log)
