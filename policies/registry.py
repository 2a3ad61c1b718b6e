"""Finding a depth policy by name: built-ins, `module:attr`, and the `specdepth.policies` entry points.

A policy spec is `name` or `name:key=value,key=value`, where name is

- a built-in (`BUILTINS`, plus `dspark`, `vllm-adaptive` and `vllm-online`, imported on first use);
- an installed plugin: an entry point in the group `specdepth.policies`, whose name is the policy
  name and whose value is `module:attr`;
- `module:attr` (e.g. `mypkg.mod:MyPolicy`), imported directly.

The target is a class (instantiated with the spec's parameters) or an instance (used as-is, and
then the spec may carry no parameters). Parameters are typed by the class's `params` defaults;
values are written plainly (`k=4`, `h=0.25`, `table=1-4:5/5-16:3/17-256:1`). The parameter list
starts after the last `:` before the first `=`, so `mypkg.mod:MyPolicy:k=4` also works.
"""

from __future__ import annotations

import importlib
import os
import sys
import importlib.metadata
from typing import Any

from specdepth.policies.arctic import ArcticHybrid
from specdepth.policies.bandit import Bandit
from specdepth.policies.base import DepthPolicy
from specdepth.policies.early_exit import EarlyExit
from specdepth.policies.hf import HfConfidence, HfHeuristic
from specdepth.policies.nightjar import Nightjar
from specdepth.policies.oracle import Oracle
from specdepth.policies.sglang import SglangAdaptive
from specdepth.policies.specdecpp import SpecDecPP
from specdepth.policies.static import Off, Static, VllmDisable, VllmTable
from specdepth.policies.tetris import Tetris
from specdepth.policies.turbospec import TurboSpec

ENTRY_POINT_GROUP = "specdepth.policies"

BUILTINS: dict[str, type[DepthPolicy]] = {
    cls.name: cls
    for cls in (
        Off,
        Static,
        VllmDisable,
        VllmTable,
        HfHeuristic,
        HfConfidence,
        SpecDecPP,
        TurboSpec,
        Bandit,
        SglangAdaptive,
        EarlyExit,
        Tetris,
        Nightjar,
        Oracle,  # replay only: needs PlanContext.oracle_match
        ArcticHybrid,  # per-sequence drafter choice: with `--drafter hybrid`
    )
}

# Built-ins that live in modules of their own, imported only when asked for (they may pull in more).
LAZY_BUILTINS: dict[str, str] = {
    "vllm-adaptive": "specdepth.policies.vllm_adaptive:VllmAdaptive",
    "vllm-online": "specdepth.policies.vllm_online:VllmOnline",
    "dspark": "specdepth.policies.dspark:DSpark",
}


def _import_target(path: str, *, missing_ok: bool = False) -> Any:
    """Import `module:attr` (attr may be dotted).

    Raises:
        ValueError: the module itself does not exist (unless `missing_ok`: then None), or has no
            such attribute. Errors raised while executing the module propagate unchanged.
    """
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"policy {path!r}: expected 'module:attr', e.g. 'mypkg.mod:MyPolicy'")
    if os.getcwd() not in sys.path:  # a user's module beside them, as `python -m` finds it; last, so
        sys.path.append(os.getcwd())  # nothing installed is shadowed by it
    try:
        obj: Any = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
            raise  # the module exists but one of its own imports is missing
        if missing_ok:
            return None
        raise ValueError(f"policy {path!r}: cannot import module {module!r} ({e})") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"policy {path!r}: module {module!r} has no attribute {attr!r}") from None
    return obj


def builtin_policies() -> dict[str, type[DepthPolicy]]:
    """Every built-in policy class by name, including the lazily imported ones that exist."""
    out = dict(BUILTINS)
    for name, path in LAZY_BUILTINS.items():
        cls = _import_target(path, missing_ok=True)
        if cls is not None:
            out[name] = cls
    return out


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _known_names() -> str:
    names = [*BUILTINS, *LAZY_BUILTINS]
    plugins = [ep.name for ep in _entry_points() if ep.name not in names]
    text = "built-ins: " + ", ".join(names)
    if plugins:
        text += "; plugins: " + ", ".join(plugins)
    return text + "; or 'module:attr'"


def parse_value(raw: str) -> bool | int | float | str:
    """`true`/`false` -> bool, then int, then float, else the string itself."""
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(raw)
        except ValueError:
            pass
    return raw


def _split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """(name, raw string parameters) of a spec; see the module docstring for the grammar."""
    text = spec.strip()
    eq = text.find("=")
    if eq < 0:
        name, rest = text, ""
    else:
        colon = text.rfind(":", 0, eq)
        if colon < 0:
            raise ValueError(f"policy spec {spec!r}: parameters follow a name, e.g. 'static:k=4'")
        name, rest = text[:colon], text[colon + 1 :]
    name = name.strip().rstrip(":")
    if not name:
        raise ValueError(f"policy spec {spec!r}: no policy name ({_known_names()})")
    raw: dict[str, str] = {}
    for item in rest.split(",") if rest.strip() else []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"policy spec {spec!r}: bad parameter {item!r}, expected key=value")
        if key in raw:
            raise ValueError(f"policy spec {spec!r}: parameter {key!r} given twice")
        raw[key] = value.strip()
    return name, raw


def parse_spec(spec: str) -> tuple[str, dict[str, object]]:
    """Split `name` or `name:key=value,...` into the name and typed parameters.

    Args:
        spec: e.g. "static:k=4", "vllm-table:table=1-4:5/5-16:3", "mypkg.mod:MyPolicy:x=1".

    Returns:
        (name, params), values typed by `parse_value`.

    Raises:
        ValueError: empty name, an item without '=', a repeated key.
    """
    name, raw = _split_spec(spec)
    return name, {k: parse_value(v) for k, v in raw.items()}


def _typed(label: str, key: str, raw: str, default: object) -> object:
    """A raw parameter string converted to the type of its declared default."""
    try:
        if isinstance(default, bool):
            low = raw.lower()
            if low not in ("true", "false"):
                raise ValueError
            return low == "true"
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        kind = type(default).__name__
        raise ValueError(f"{label}: parameter {key}={raw!r} is not a valid {kind}") from None
    return raw if isinstance(default, str) else parse_value(raw)


def _declared_params(target: type) -> dict[str, object] | None:
    """The class's own `params` declaration, or None if it declares none (inherits the base's)."""
    params = getattr(target, "params", None)
    return params if isinstance(params, dict) and params is not DepthPolicy.params else None


def _instantiate(target: Any, raw: dict[str, str], label: str) -> DepthPolicy:
    if isinstance(target, type):
        declared = _declared_params(target)
        if declared is None:
            kwargs = {k: parse_value(v) for k, v in raw.items()}
        else:
            unknown = sorted(set(raw) - set(declared))
            if unknown:
                takes = ", ".join(f"{k} (default {v!r})" for k, v in declared.items()) or "no parameters"
                raise ValueError(f"{label}: unknown parameter(s) {', '.join(unknown)}; it takes {takes}")
            kwargs = {k: _typed(label, k, v, declared[k]) for k, v in raw.items()}
        try:
            policy = target(**kwargs)
        except TypeError as e:
            raise ValueError(f"{label}: cannot construct with {kwargs}: {e}") from e
    elif raw:
        raise ValueError(f"{label} is a policy instance; it takes no parameters (got {sorted(raw)})")
    else:
        policy = target
    if not callable(getattr(policy, "plan", None)):
        raise ValueError(f"{label} is not a depth policy (a DepthPolicy class or instance with plan())")
    return policy


def make_policy(spec: str) -> DepthPolicy:
    """Build the policy a spec names (built-in, entry point, or `module:attr`).

    Args:
        spec: see the module docstring, e.g. "off", "vllm-disable:threshold=16", "mypkg.m:P".

    Returns:
        A fresh policy instance (or the instance a `module:attr` names).

    Raises:
        ValueError: unknown name or parameter, a parameter of the wrong type, an invalid value,
            or a target that is not a policy; the message lists what exists.
    """
    name, raw = _split_spec(spec)
    if name in BUILTINS:
        return _instantiate(BUILTINS[name], raw, f"policy {name!r}")
    if name in LAZY_BUILTINS:
        cls = _import_target(LAZY_BUILTINS[name], missing_ok=True)
        if cls is None:
            raise ValueError(f"built-in policy {name!r} is not available in this install ({_known_names()})")
        return _instantiate(cls, raw, f"policy {name!r}")
    for ep in _entry_points():
        if ep.name == name:
            return _instantiate(ep.load(), raw, f"policy {name!r} (entry point {ep.value})")
    module, sep, attr = name.partition(":")
    if sep and (module in BUILTINS or module in LAZY_BUILTINS):
        raise ValueError(f"policy spec {spec!r}: bad parameter {attr!r}, expected key=value")
    if not sep:
        raise ValueError(f"unknown policy {name!r} ({_known_names()})")
    return _instantiate(_import_target(name), raw, f"policy {name!r}")


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n", 1)[0].strip()


def list_policies() -> list[tuple[str, dict[str, object], str]]:
    """(name, parameters with defaults, one-line doc) of every built-in and installed plugin.

    A plugin that fails to load is listed with the error as its doc, so one broken package does
    not hide the rest.
    """
    rows = [(n, dict(c.params), _first_line(c.__doc__)) for n, c in builtin_policies().items()]
    seen = {r[0] for r in rows}
    for ep in _entry_points():
        if ep.name in seen:
            continue
        seen.add(ep.name)
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001 - a listing reports a broken plugin, it does not crash
            rows.append((ep.name, {}, f"(cannot load {ep.value}: {type(e).__name__}: {e})"))
            continue
        params = getattr(obj, "params", None)
        rows.append((ep.name, dict(params) if isinstance(params, dict) else {}, _first_line(obj.__doc__)))
    return rows
