"""What the server is made of: its options, the cluster of replicas, the tokenizer, the chat template.

`ServeOptions` is the one configuration of `specdepth serve` and of the Serve config file
(experiments/serve_config.yaml passes it as `args`); `build_cluster` starts the replicas with the
cost model it names, and the tokenizer (and a chat template, for HF checkpoints that have one)
load here without the models, which load in the replicas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Optional

from specdepth.workers.drafters.names import DEFAULT_DRAFTER, DRAFTER_NAMES

BUNDLED_NAME = "specdepth-bundled"


@dataclass(frozen=True)
class ServeOptions:
    """One server: its pair, its replicas and how requests reach them."""

    target: Optional[str] = None  # .safetensors or HF folder (with draft); None: the bundled pair
    draft: Optional[str] = None
    replicas: int = 1  # Ray actors, one pair each
    policy: str = "dspark"  # depth policy spec
    max_batch: int = 16  # sequences one replica runs at once
    max_depth: int = 8  # K, the largest draft budget
    cost: str = "auto"  # auto (profile replica 0's pair once, cached), a profile JSON, a preset, fixed:...
    model_name: Optional[str] = None  # default: specdepth-bundled, or the target's folder/file name
    max_queue: Optional[int] = None  # admitted requests at once (default 4 x replicas x max_batch)
    # a replica sends committed tokens at most this often (first tokens, finishes at once): each answer
    # costs the replica's process a Ray call, ~1.5 ms of a 2-core machine's CPU (0.02 s: ~10% fewer tokens/s)
    stream_s: float = 0.05
    temperature: float = 0.0  # the replicas' sampling (0: greedy); requests must match it
    top_p: float = 1.0
    seed: int = 0
    device: str = "auto"
    threads: int = 0  # torch CPU threads per replica (0: torch's default)
    compile: str = "off"  # the replicas' passes: auto|on|off (workers/compiled.py)
    drafter: str = DEFAULT_DRAFTER  # what drafts: model, ngram, suffix, hybrid (workers/drafters/)
    ngram_min: int = 1  # the ngram drafter's suffix lengths
    ngram_max: int = 4

    def __post_init__(self) -> None:
        if (self.target is None) != (self.draft is None):
            raise ValueError("give both target and draft, or neither (the bundled pair)")
        if self.drafter not in DRAFTER_NAMES:
            raise ValueError(f"unknown drafter {self.drafter!r}; expected one of {', '.join(DRAFTER_NAMES)}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}")
        if self.replicas < 1 or self.max_batch < 1 or self.max_depth < 0 or self.stream_s < 0 \
                or (self.max_queue is not None and self.max_queue < 1):
            raise ValueError(f"need replicas, max_batch, max_queue >= 1, max_depth >= 0, stream_s >= 0: {self}")

    @classmethod
    def from_args(cls, args: Optional[dict]) -> "ServeOptions":
        """From a Serve config's `args` (unknown keys are an error naming them)."""
        args = dict(args or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"unknown serve options {unknown}; known: {sorted(known)}")
        return cls(**args)

    @property
    def name(self) -> str:
        """The model name clients send."""
        if self.model_name:
            return self.model_name
        if self.target is None:
            return BUNDLED_NAME
        p = Path(self.target)
        return p.name if p.is_dir() else p.stem

    @property
    def queue_limit(self) -> int:
        return self.max_queue or 4 * self.replicas * self.max_batch


def chat_renderer(target: Optional[str]) -> Optional[Callable[[list[dict]], str]]:
    """A function rendering chat messages to a prompt, from an HF folder's tokenizer_config.json
    `chat_template` (jinja2, sandboxed); None when the pair has no template."""
    if target is None or not Path(target).is_dir():
        return None
    cfg_path = Path(target) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if not template:
        return None
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def fail(msg: str) -> None:
        raise ValueError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = fail
    compiled = env.from_string(template)
    special = {k: (v["content"] if isinstance(v, dict) else v) for k, v in cfg.items()
               if k in ("bos_token", "eos_token", "pad_token", "unk_token") and v}
    return lambda messages: compiled.render(messages=messages, add_generation_prompt=True, **special)


def build_cluster(opts: ServeOptions) -> Any:
    """Start the replicas (a `ClusterController`) with the policy and cost model `opts` name.

    Raises:
        ValueError: a bad policy or cost spec; RuntimeError: a replica could not start.
    """
    from specdepth.adaptive.replicas.cluster import ClusterConfig, ClusterController
    from specdepth.adaptive.cost.model import parse_cost
    from specdepth.adaptive.replicas.replica import ReplicaConfig
    from specdepth.policies.registry import make_policy
    from specdepth.workers.pair_spec import PairSpec
    from specdepth.workers.sampler import SamplingParams

    policy = make_policy(opts.policy)
    if getattr(policy, "replay_only", False):
        raise ValueError(f"policy {policy.name!r} needs the future (true match lengths): replay only")
    cost = None if opts.cost == "auto" else parse_cost(opts.cost)
    rc = ReplicaConfig(pair=PairSpec(opts.target, opts.draft), n_slots=opts.max_batch, max_depth=opts.max_depth,
                       sampling=SamplingParams(opts.temperature, opts.top_p), seed=opts.seed, device=opts.device,
                       threads=opts.threads, compile=opts.compile, drafter=opts.drafter,
                       ngram=(opts.ngram_min, opts.ngram_max))
    cc = ClusterController(policy, ClusterConfig(replicas=opts.replicas, replica=rc, stream_s=opts.stream_s))
    cc.set_cost(cost if cost is not None else cc.profiled_cost())
    return cc
