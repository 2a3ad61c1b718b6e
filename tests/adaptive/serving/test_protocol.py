"""The serving front's parts without a server: request checks, streamed text, chat templates, and
the router thread over a stand-in cluster."""

from __future__ import annotations

import json
import threading
import time
from collections import deque

import pytest

from specdepth.adaptive.engine import Request, RequestError, RequestOutput
from specdepth.adaptive.serving.protocol import ApiError, ServerLimits, TextStream, parse_completion
from specdepth.adaptive.serving.router import Router
from specdepth.adaptive.serving.setup import ServeOptions, chat_renderer
from specdepth.workers.sampler import SamplingParams


class ByteTok:
    """Token i is byte i: multi-byte characters need several tokens, as with byte-level BPE."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


LIMITS = ServerLimits("m", max_len=64, vocab_size=256)


def _stream(pieces: list[str], stops: list[str]) -> tuple[str, TextStream]:
    s = TextStream(ByteTok(), stops)
    raw = [list(p.encode()) for p in pieces]
    out = "".join(s.push(toks) for toks in raw)
    return out + s.push([], final=True), s


def test_text_is_sent_once_and_whole_characters_only():
    s = TextStream(ByteTok(), [])
    e = list("é".encode())  # two bytes
    assert s.push([ord("a"), e[0]]) == "a"  # half a character is held back
    assert s.push([e[1], ord("b")]) == "éb"
    assert s.push([], final=True) == ""


def test_stop_string_across_rounds_cuts_the_text():
    out, s = _stream(["hello wo", "rld and more"], ["world"])
    assert (out, s.stopped, s.finish_reason("length")) == ("hello ", True, "stop")
    out, s = _stream(["abc", "def"], ["xyz"])
    assert (out, s.stopped, s.finish_reason("length"), s.finish_reason("eos")) == ("abcdef", False, "length", "stop")


@pytest.mark.parametrize("body,param", [
    ({"model": "m", "prompt": "x", "n": 2}, "n"),
    ({"model": "m", "prompt": "x", "echo": True}, "echo"),
    ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": "m", "prompt": [1, 999]}, "prompt"),
    ({"model": "m", "prompt": ""}, "prompt"),
    ({"model": "m", "prompt": "x", "stop": ["a"] * 5}, "stop"),
    ({"model": "m", "prompt": "x", "max_tokens": 1.5}, "max_tokens"),
    ({"model": "m", "prompt": "x", "temperature": -0.5}, "temperature"),
    ({"model": "m", "prompt": "x", "top_p": 0}, "top_p"),
    ({"model": "m", "prompt": "x", "seed": -1}, "seed"),
    ({"model": "m", "prompt": "x", "seed": 1.5}, "seed"),
    ({"model": "m", "prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
    ({"model": "m", "prompt": "x", "frequency_penalty": -1}, "frequency_penalty"),
    ({"model": "m", "prompt": "x", "logit_bias": {"5": 10}}, "logit_bias"),
    ({"model": "m", "prompt": "x", "logprobs": 2}, "logprobs"),
    ({"prompt": "x"}, "model"),
])
def test_bad_requests_name_their_parameter(body, param):
    with pytest.raises(ApiError) as e:
        parse_completion(body, ByteTok(), LIMITS)
    assert e.value.status == 400 and e.value.param == param
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}


def test_each_request_brings_its_own_sampling_the_servers_as_defaults():
    sampled = ServerLimits("m", 64, 256, SamplingParams(0.8, 0.9))
    ok = parse_completion({"model": "m", "prompt": ["ab", "c"]}, ByteTok(), sampled)
    assert ok.prompts == [[97, 98], [99]] and ok.max_tokens == 62 and ok.sampling == SamplingParams(0.8, 0.9)
    for extra, want in (({"top_p": 0.5}, SamplingParams(0.8, 0.5)), ({"seed": 1}, SamplingParams(0.8, 0.9, 1)),
                        ({"temperature": 0}, SamplingParams(0.0, 0.9))):
        assert parse_completion({"model": "m", "prompt": "x", **extra}, ByteTok(), sampled).sampling == want
    greedy = parse_completion({"model": "m", "prompt": "x", "temperature": 0.7, "seed": 7}, ByteTok(), LIMITS)
    assert greedy.sampling == SamplingParams(0.7, 1.0, 7)


def test_chat_template_renders_and_is_none_without_one(tmp_path):
    template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "</s>"}))
    render = chat_renderer(str(tmp_path))
    assert render([{"role": "user", "content": "hi"}]) == "<user>hi</s><assistant>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert chat_renderer(str(tmp_path)) is None and chat_renderer(None) is None


def test_serve_options_from_config_args():
    assert ServeOptions.from_args({"replicas": 2, "max_batch": 4}).queue_limit == 32
    assert ServeOptions.from_args(None).name == "specdepth-bundled"
    with pytest.raises(ValueError, match="unknown serve options"):
        ServeOptions.from_args({"replica": 2})


class FakeCluster:
    """One token per running request per step (token = how many it had), no replicas."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.queue: deque = deque()
        self.seqs: dict[str, tuple[Request, RequestOutput]] = {}
        self.steps, self.fail_after, self.wakes = 0, fail_after, 0

    def submit(self, req: Request) -> RequestOutput:
        if not req.prompt_ids:
            raise RequestError(req.request_id, "empty prompt")
        out = RequestOutput(req.request_id, req.prompt_ids)
        self.seqs[req.request_id] = (req, out)
        return out

    def has_work(self) -> bool:
        return bool(self.seqs)

    def step(self) -> None:
        time.sleep(0.001)
        self.steps += 1
        if self.fail_after is not None and self.steps > self.fail_after:
            raise RuntimeError("no replica left")
        for rid, (req, out) in list(self.seqs.items()):
            tok = [len(out.output_ids)]
            out.output_ids += tok
            if req.on_token is not None:
                req.on_token(rid, tok)
            if len(out.output_ids) == req.max_new_tokens:
                out.finish_reason = "length"
                del self.seqs[rid]

    def cancel(self, rid: str) -> bool:
        return self.seqs.pop(rid, None) is not None

    def wake(self) -> None:
        self.wakes += 1

    def shutdown(self) -> None:
        pass


def _run(router: Router, reqs: list[Request]) -> dict[str, RequestOutput]:
    done: dict[str, RequestOutput] = {}
    all_done = threading.Event()

    def on_done(out: RequestOutput) -> None:
        assert out.request_id not in done  # exactly once
        done[out.request_id] = out
        if len(done) == len(reqs):
            all_done.set()

    for r in reqs:
        router.submit(r, on_done)
    assert all_done.wait(10)
    return done


def test_router_streams_each_token_once_and_ends_each_request_once():
    router = Router(FakeCluster())
    got: dict[str, list[int]] = {}
    reqs = [Request(f"r{i}", [1], 3 + i, on_token=lambda rid, t: got.setdefault(rid, []).extend(t)) for i in range(4)]
    reqs.append(Request("bad", [], 3))
    done = _run(router, reqs)
    router.stop()
    assert router.cluster.wakes == len(reqs)  # each submission woke the replicas' exchanges
    assert {rid: o.output_ids for rid, o in done.items() if rid != "bad"} == got == \
        {f"r{i}": list(range(3 + i)) for i in range(4)}
    assert done["bad"].finish_reason == "error" and router.pending == 0


def test_router_cancel_and_cluster_failure():
    cluster = FakeCluster(fail_after=300)
    router = Router(cluster)
    started = threading.Event()
    reqs = [Request("long", [1], 10**6, on_token=lambda rid, t: started.set()), Request("doomed", [1], 10**6)]
    done: dict[str, RequestOutput] = {}
    finished = threading.Event()

    def on_done(out: RequestOutput) -> None:
        done[out.request_id] = out
        if len(done) == 2:
            finished.set()

    for r in reqs:
        router.submit(r, on_done)
    assert started.wait(5)
    router.cancel("long")
    assert finished.wait(10)
    assert done["long"].finish_reason == "cancelled" and done["doomed"].finish_reason == "error"
    assert "no replica left" in router.error
    with pytest.raises(RuntimeError):
        router.submit(Request("late", [1], 1), on_done)
    router.stop()


def test_what_clients_send_by_default_is_accepted():
    body = {"model": "m", "prompt": "x", "user": "u-1", "presence_penalty": 0, "frequency_penalty": 0.0,
            "logit_bias": {}, "echo": False, "n": 1, "logprobs": None, "stream_options": {"include_usage": True}}
    got = parse_completion(body, ByteTok(), LIMITS)
    assert got.prompts == [[120]] and got.include_usage


def test_max_tokens_defaults_to_the_rest_of_the_context():
    assert parse_completion({"model": "m", "prompt": "abc"}, ByteTok(), LIMITS).max_tokens == LIMITS.max_len - 3
    assert parse_completion({"model": "m", "prompt": ["abc", "a"]}, ByteTok(), LIMITS).max_tokens == LIMITS.max_len - 3
    chat = parse_completion({"model": "m", "messages": []}, ByteTok(), LIMITS, prompts=[[1, 2, 3]])
    assert chat.max_tokens == LIMITS.max_len - 3
