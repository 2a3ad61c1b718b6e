"""`specdepth serve` over a Hugging Face pair whose tokenizer config has a chat template: chat
completions (plain and streamed) equal the plain completion of the rendered prompt, and the
model's name defaults to the target's folder name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("transformers")

from tests.adaptive.serving.test_serve import launch, stop, wait_ready  # noqa: E402

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def write_char_tokenizer(folder: Path, vocab_size: int) -> None:
    """A character tokenizer (ids 0 and 1 are <pad> and </s>), and a tokenizer config with TEMPLATE."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    vocab = {"<pad>": 0, "</s>": 1, **{chr(32 + i): i + 2 for i in range(vocab_size - 2)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<pad>", "</s>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "chat_template": TEMPLATE}))


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory):
    from tests.workers.hf_fixtures import VOCAB, make_hf_pair
    pair = make_hf_pair(tmp_path_factory.mktemp("hfchat"))
    for folder in (pair.target_path, pair.draft_path):
        write_char_tokenizer(folder, VOCAB)
    proc, base, log = launch("--target", str(pair.target_path), "--draft", str(pair.draft_path))
    wait_ready(proc, log)
    yield base
    stop(proc, log)


def test_chat_equals_the_rendered_completion(hf_server):
    client = openai.OpenAI(base_url=f"{hf_server}/v1", api_key="x", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["target"]
    msgs = [{"role": "user", "content": "hi there"}]
    plain = client.completions.create(model="target", prompt="<user>hi there<assistant>", max_tokens=12)
    chat = client.chat.completions.create(model="target", messages=msgs, max_tokens=12)
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage.total_tokens == plain.usage.total_tokens
    chunks = list(client.chat.completions.create(model="target", messages=msgs, max_tokens=12, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.choices[0].text
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
