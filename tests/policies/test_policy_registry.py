"""Registry: spec parsing, errors that list what exists, module:attr and entry-point loading."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdepth.policies import registry
from specdepth.policies.base import DepthPolicy
from specdepth.policies.registry import BUILTINS, list_policies, make_policy, parse_spec
from specdepth.policies.static import Static, VllmTable

USER_MODULE = '''
import numpy as np
from specdepth.policies.base import DepthPolicy

class MyPolicy(DepthPolicy):
    """Always k, plus nothing else."""
    name = "mine"
    params = {"k": 2, "scale": 1.0, "greedy": False}

    def __init__(self, k=2, scale=1.0, greedy=False):
        self.k, self.scale, self.greedy = k, scale, greedy

    def plan(self, ctx):
        return np.full(ctx.batch_size, self.k, dtype=np.int64)

INSTANCE = MyPolicy(k=1)
NOT_A_POLICY = 42

class Undeclared(DepthPolicy):
    def __init__(self, depth=1):
        self.depth = depth
    def plan(self, ctx):
        return np.full(ctx.batch_size, self.depth, dtype=np.int64)
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A user's policy module `specdepth_user_mod` on sys.path; removed again afterwards."""
    (tmp_path / "specdepth_user_mod.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "specdepth_user_mod", raising=False)
    yield "specdepth_user_mod"
    sys.modules.pop("specdepth_user_mod", None)


@pytest.mark.parametrize(
    ("spec", "name", "params"),
    [
        ("off", "off", {}),
        ("static:k=4", "static", {"k": 4}),
        (" static : k = 4 ", "static", {"k": 4}),
        ("specdec++:h=0.25,min_depth=1", "specdec++", {"h": 0.25, "min_depth": 1}),
        ("x:flag=true,other=False", "x", {"flag": True, "other": False}),
        ("vllm-table:table=1-4:5/5-16:3/17-256:1", "vllm-table", {"table": "1-4:5/5-16:3/17-256:1"}),
        ("mypkg.mod:MyPolicy", "mypkg.mod:MyPolicy", {}),
        ("mypkg.mod:MyPolicy:k=4,t=1e-3", "mypkg.mod:MyPolicy", {"k": 4, "t": 1e-3}),
        ("static:", "static", {}),
    ],
)
def test_parse_spec(spec: str, name: str, params: dict[str, object]) -> None:
    got_name, got = parse_spec(spec)
    assert got_name == name and got == params
    assert [type(v) for v in got.values()] == [type(v) for v in params.values()]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "no policy name"),
        ("k=3", "parameters follow a name"),
        (":k=3", "no policy name"),
        ("static:k=1,k=2", "given twice"),
        ("static:k=1,,h=2", "bad parameter"),
        ("static:k=1,=2", "bad parameter"),
    ],
)
def test_parse_spec_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_spec(spec)


def test_make_builtin_with_typed_params() -> None:
    p = make_policy("static:k=5")
    assert isinstance(p, Static) and p.k == 5
    t = make_policy("vllm-table:table=1-2:4/3-8:1")
    assert isinstance(t, VllmTable) and t.depth_for(5) == 1
    assert make_policy("turbospec:alpha_init=1").alpha == 1.0  # int written, float declared
    assert make_policy("static") is not make_policy("static")  # fresh state every time


def test_unknown_name_lists_what_exists() -> None:
    with pytest.raises(ValueError) as err:
        make_policy("nope")
    for name in [*BUILTINS, "dspark", "vllm-adaptive", "module:attr"]:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("static:q=1", r"unknown parameter\(s\) q; it takes k \(default 3\)"),
        ("off:k=1", "it takes no parameters"),
        ("static:k=2.5", "not a valid int"),
        ("turbospec:period=soon", "not a valid int"),
        ("bandit:c=high", "not a valid float"),
        ("static:k", "bad parameter 'k'"),
        ("static:k=-1", "k must be"),  # the class's own validation
        ("vllm-table:table=2-4:1", "start at batch size 1"),
    ],
)
def test_bad_parameters(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_policy(spec)


def test_module_attr_class_instance_and_errors(user_module: str) -> None:
    p = make_policy(f"{user_module}:MyPolicy:k=3,scale=2,greedy=true")
    assert (p.k, p.scale, p.greedy) == (3, 2.0, True) and isinstance(p.scale, float)
    inst = make_policy(f"{user_module}:INSTANCE")
    assert inst is sys.modules[user_module].INSTANCE
    undeclared = make_policy(f"{user_module}:Undeclared:depth=4")  # no params: passed through
    assert undeclared.depth == 4
    with pytest.raises(ValueError, match="takes no parameters"):
        make_policy(f"{user_module}:INSTANCE:k=2")
    with pytest.raises(ValueError, match="unknown parameter"):
        make_policy(f"{user_module}:MyPolicy:depth=2")
    with pytest.raises(ValueError, match="not a depth policy"):
        make_policy(f"{user_module}:NOT_A_POLICY")
    with pytest.raises(ValueError, match="no attribute 'Missing'"):
        make_policy(f"{user_module}:Missing")
    with pytest.raises(ValueError, match="cannot import module"):
        make_policy("specdepth_no_such_module:Policy")


def test_entry_point_plugin(user_module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    eps = [
        importlib.metadata.EntryPoint("mine", f"{user_module}:MyPolicy", registry.ENTRY_POINT_GROUP),
        importlib.metadata.EntryPoint("broken", "specdepth_no_such_module:X", registry.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(registry, "_entry_points", lambda: eps)
    assert make_policy("mine:k=6").k == 6
    rows = {name: (params, doc) for name, params, doc in list_policies()}
    assert rows["mine"] == ({"k": 2, "scale": 1.0, "greedy": False}, "Always k, plus nothing else.")
    assert rows["broken"][1].startswith("(cannot load")
    with pytest.raises(ValueError, match="plugins: mine, broken"):
        make_policy("nope")


def test_list_policies_lists_every_builtin() -> None:
    rows = list_policies()
    names = [r[0] for r in rows]
    assert names[: len(BUILTINS)] == list(BUILTINS)
    assert len(set(names)) == len(names)
    for name, params, doc in rows:
        cls = registry.builtin_policies()[name]
        assert params == cls.params and doc and "\n" not in doc


def test_missing_lazy_builtin_is_skipped_then_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "LAZY_BUILTINS", {"ghost": "specdepth.policies.ghost_not_written:Ghost"})
    assert "ghost" not in [r[0] for r in list_policies()]
    with pytest.raises(ValueError, match="'ghost' is not available"):
        make_policy("ghost")


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_classes_declare_name_params_and_default_construct(name: str) -> None:
    cls = BUILTINS[name]
    assert issubclass(cls, DepthPolicy) and cls.name == name
    p = cls(**cls.params)
    assert p.describe().startswith(f"{name}(")
    assert make_policy(name).describe() == p.describe()
