"""`specdepth serve` end to end: one real server (a subprocess with its own embedded Ray, the bundled
pair, two replicas) on loopback, driven by the real `openai` client and by raw HTTP.

Texts are checked against `specdepth generate` (greedy: the target's own output) for the same
prompts; the server's process tree is recorded before SIGTERM, and none of it may outlive it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")

COST = "fixed:target_ms=10,draft_ms=1"  # no profiling at start-up
MODEL = "specdepth-bundled"
MAX_QUEUE = 40
LONG = 160  # tokens of the reference run (and of the streams a replica kill interrupts)
N = 24  # tokens of the plain completions
PROMPTS = ["def parse_args(argv):", "import numpy as np\n", "class Stack:\n    def __init__(self):",
           "The quick brown fox", "for i in range(10):\n", "def fib(n):\n    if n < 2:"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children of children ...), from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def launch(*flags: str) -> tuple[subprocess.Popen, str, str]:
    """Start `specdepth serve FLAGS` on a free loopback port: (process, base URL, its log file)."""
    port = _free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "specdepth.experiments.cli.main", "serve", "--cost", COST,
                             "--port", str(port), *flags], stdout=subprocess.PIPE, stderr=log, env=env,
                            start_new_session=True)
    return proc, f"http://127.0.0.1:{port}", log.name


def wait_ready(proc: subprocess.Popen, log: str, timeout_s: float = 120) -> None:
    """Until the server prints its ready line; fails with its log's tail if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while "Ctrl-C or SIGTERM" not in Path(log).read_text(errors="replace"):
        assert proc.poll() is None, Path(log).read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"the server did not come up in {timeout_s:.0f} s"
        time.sleep(0.25)


def stop(proc: subprocess.Popen, log: str) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    os.unlink(log)


@pytest.fixture(scope="module")
def server():
    """(base URL, Popen, reference {prompt: token ids}) for one running `specdepth serve`."""
    proc, base, log = launch("--replicas", "2", "--max-queue", str(MAX_QUEUE))
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    gen = subprocess.run([sys.executable, "-m", "specdepth.experiments.cli.main", "generate", "--prompts", f.name,
                          "--max-new-tokens", str(LONG), "--cost", COST, "--json"],
                         capture_output=True, text=True, timeout=120)
    os.unlink(f.name)
    assert gen.returncode == 0, gen.stderr
    ref = {o["prompt"]: o["token_ids"] for o in map(json.loads, gen.stdout.splitlines())}
    wait_ready(proc, log)
    yield base, proc, ref
    stop(proc, log)


@pytest.fixture(scope="module")
def tok():
    from specdepth.workers.bundled import load_tokenizer
    return load_tokenizer(None)


def _client(base: str):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=60)


def _expect(tok, ref: dict, prompt: str, n: int) -> str:
    return tok.decode(ref[prompt][:n])


def _post(base: str, path: str, body, timeout: float = 30) -> tuple[int, Any, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def _get(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return json.loads(r.read())


def test_health_and_models(server):
    base, _, _ = server
    assert _get(base, "/health") == {"status": "ok"}
    assert [m.id for m in _client(base).models.list().data] == [MODEL]


def test_completion_equals_generate(server, tok):
    base, _, ref = server
    p = PROMPTS[0]
    r = _client(base).completions.create(model=MODEL, prompt=p, max_tokens=LONG, temperature=0)
    assert r.choices[0].text == tok.decode(ref[p])
    assert r.choices[0].finish_reason == ("length" if len(ref[p]) == LONG else "stop")
    n_prompt = len(tok.encode(p))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == \
        (n_prompt, len(ref[p]), n_prompt + len(ref[p]))


def test_greedy_sampled_and_seeded_requests_share_the_batch(server, tok):
    """Concurrent requests at their own settings: greedy ones equal generate's text, a seeded
    one repeats its text (whatever shares its batch, on whichever replica), T=0.7 ones sample."""
    from concurrent.futures import ThreadPoolExecutor
    base, _, ref = server
    client = _client(base)

    done: list[tuple[str, str, int]] = []  # (kind, finish reason, completion tokens) of each request

    def ask(kind: str, p: str) -> str:
        extra = {"greedy": {"temperature": 0}, "hot": {"temperature": 0.7},
                 "seeded": {"temperature": 0.9, "top_p": 0.95, "seed": 1234}}[kind]
        r = client.completions.create(model=MODEL, prompt=p, max_tokens=N, **extra)
        done.append((kind, r.choices[0].finish_reason, r.usage.completion_tokens))
        return r.choices[0].text

    texts = []
    for mix in (["greedy", "hot", "seeded", "greedy", "hot"], ["seeded", "hot", "hot", "greedy", "hot", "hot"]):
        with ThreadPoolExecutor(len(mix)) as pool:
            got = list(pool.map(ask, mix, [PROMPTS[i % 2] for i in range(len(mix))]))
        for kind, p, text in zip(mix, [PROMPTS[i % 2] for i in range(len(mix))], got):
            if kind == "greedy":
                assert text == _expect(tok, ref, p, N)
        texts.append(got[mix.index("seeded")])  # at an even index: on PROMPTS[0]
    # every request ran: N tokens, or an end of text sampled (after "import numpy as np\n" the
    # target itself ends at once in ~0.3% of T=0.7 samples: an empty text is a valid answer)
    assert all((finish, n) == ("length", N) or (finish == "stop" and 1 <= n <= N) for _, finish, n in done), done
    seeded = [ask("seeded", PROMPTS[0]) for _ in range(2)]
    assert seeded[0] == seeded[1] == texts[0] == texts[1]
    hot = {ask("hot", PROMPTS[0]) for _ in range(3)}
    assert len(hot) > 1 or hot != {_expect(tok, ref, PROMPTS[0], N)}  # unseeded sampling varies


def test_stream_include_usage_and_what_clients_send_by_default(server, tok):
    base, _, ref = server
    p = PROMPTS[3]
    chunks = list(_client(base).completions.create(
        model=MODEL, prompt=p, max_tokens=N, stream=True, stream_options={"include_usage": True}, user="u-1",
        presence_penalty=0, frequency_penalty=0, n=1, echo=False))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == _expect(tok, ref, p, N)
    assert chunks[-1].usage.completion_tokens == N and not chunks[-1].choices
    code, _, err = _post(base, "/v1/completions", {"model": MODEL, "prompt": "x", "presence_penalty": 1})
    assert code == 400 and err["error"]["param"] == "presence_penalty"


def test_streamed_completion_equals_generate(server, tok):
    base, _, ref = server
    p = PROMPTS[1]
    chunks = list(_client(base).completions.create(model=MODEL, prompt=p, max_tokens=LONG, stream=True))
    assert len(chunks) > 2  # tokens arrive round by round, not at the end
    assert "".join(c.choices[0].text for c in chunks) == tok.decode(ref[p])
    assert [c.choices[0].finish_reason for c in chunks][-1] in ("length", "stop")
    assert all(c.object == "text_completion" for c in chunks)


def test_prompt_list_and_stop(server, tok):
    base, _, ref = server
    r = _client(base).completions.create(model=MODEL, prompt=PROMPTS[:3], max_tokens=N)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == [_expect(tok, ref, p, N) for p in PROMPTS[:3]]
    full = _expect(tok, ref, PROMPTS[0], N)
    stop = full[10:14]
    r = _client(base).completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=N, stop=[stop, "@@@"])
    assert (r.choices[0].text, r.choices[0].finish_reason) == (full[:full.index(stop)], "stop")


BAD = [  # (body, status, param)
    (b"{not json", 400, None),
    ({"model": MODEL}, 400, "prompt"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 5000}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"model": MODEL, "prompt": "x", "seed": -3}, 400, "seed"),
    ({"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"model": MODEL, "prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ({"model": "gpt-4", "prompt": "x"}, 400, "model"),
    ({"model": MODEL, "prompt": "word " * 2000}, 400, "prompt"),
    ({"model": MODEL, "prompt": ["x"] * (MAX_QUEUE + 1)}, 429, None),
]


@pytest.mark.parametrize("body,status,param", BAD, ids=["json", "no-prompt", "max-tokens-0", "max-tokens-ctx",
                                                       "temp-neg", "seed-neg", "top-p-0", "top-p-big",
                                                       "model", "prompt-ctx", "overload"])
def test_bad_input(server, body, status, param):
    base, _, _ = server
    code, headers, err = _post(base, "/v1/completions", body)
    assert code == status, err
    assert set(err["error"]) == {"message", "type", "param", "code"} and err["error"]["message"]
    assert err["error"]["param"] == param
    if status == 429:
        assert int(headers["Retry-After"]) >= 1


def test_chat_without_template_is_400(server):
    base, _, _ = server
    code, _, err = _post(base, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert code == 400 and "chat template" in err["error"]["message"]


def _stream_text(base: str, prompt: str, n: int, out: list, i: int, first: threading.Event | None = None) -> None:
    text = ""
    for c in _client(base).completions.create(model=MODEL, prompt=prompt, max_tokens=n, stream=True):
        text += c.choices[0].text
        if first is not None and text:
            first.set()
    out[i] = text


def test_32_concurrent_streams(server, tok):
    base, _, ref = server
    out: list = [None] * 32
    threads = [threading.Thread(target=_stream_text, args=(base, PROMPTS[i % len(PROMPTS)], N + i % 5, out, i))
               for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert out == [_expect(tok, ref, PROMPTS[i % len(PROMPTS)], N + i % 5) for i in range(32)]


def test_disconnect_frees_the_slot(server):
    base, _, _ = server
    req = urllib.request.Request(base + "/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 900,
                                                  "stream": True}).encode())
    r = urllib.request.urlopen(req, timeout=30)
    assert r.readline().startswith(b"data: ")
    r.close()
    deadline = time.monotonic() + 3  # 900 tokens take far longer; a cancel nudges the replica at once
    while sum(rep["running"] for rep in _get(base, "/debug/replicas")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sum(rep["running"] for rep in _get(base, "/debug/replicas")) == 0


def test_replica_killed_mid_stream(server, tok):
    base, _, ref = server
    before = _get(base, "/debug/replicas")
    out: list = [None] * 4
    first = threading.Event()
    threads = [threading.Thread(target=_stream_text, args=(base, PROMPTS[i], LONG, out, i, first)) for i in range(4)]
    for t in threads:
        t.start()
    assert first.wait(30)
    os.kill(before[0]["pid"], signal.SIGKILL)
    assert all(t.is_alive() for t in threads)  # killed mid-stream
    for t in threads:
        t.join(90)
    assert out == [tok.decode(ref[p]) for p in PROMPTS[:4]]
    after = _get(base, "/debug/replicas")
    assert after[0]["failures"] == before[0]["failures"] + 1 and after[0]["pid"] != before[0]["pid"]


def _listening() -> dict[int, str]:
    """Socket inode -> local address of every listening TCP socket on the machine (/proc/net)."""
    import ipaddress
    out = {}
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != "0A":  # LISTEN
                continue
            raw = bytes.fromhex(cols[1].split(":")[0])
            # the kernel prints each 32-bit word in host (little-endian) order
            addr = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out[int(cols[9])] = str(ipaddress.ip_address(addr))
    return out


def test_every_listener_is_loopback(server):
    from specdepth.adaptive.replicas.ray_local import is_loopback
    _, proc, _ = server
    listening, wide = _listening(), []
    for pid in {proc.pid, *_descendants(proc.pid)}:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            inode = int(link[8:-1]) if link.startswith("socket:[") else None
            if inode in listening and not is_loopback(listening[inode]):
                wide.append((Path(f"/proc/{pid}/comm").read_text().strip(), listening[inode]))
    assert listening and wide == []


def test_sigterm_drains_exits_and_leaves_no_ray(server, tok):
    base, proc, ref = server
    out: list = [None]
    first = threading.Event()
    stream = threading.Thread(target=_stream_text, args=(base, PROMPTS[5], LONG, out, 0, first))
    stream.start()
    assert first.wait(30)
    tree = _descendants(proc.pid)
    assert tree  # the embedded Ray: gcs_server, raylet, workers
    proc.send_signal(signal.SIGTERM)
    stream.join(60)
    assert out == [tok.decode(ref[PROMPTS[5]])]  # the stream in flight finished whole
    assert proc.wait(60) == 0
    assert proc.stdout.read() == b""  # the URL line goes to stderr; stdout stays empty
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in tree if _alive(p)] == []
