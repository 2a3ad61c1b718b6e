"""The one import name: specdepth installs as `specdepth.*` only, a user's own `experiments/` or
`policies/` first on PYTHONPATH leaves it unaffected, and the README's custom policy runs."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUICK = ["--cost", "fixed:target_ms=5,draft_ms=1", "--max-new-tokens", "4", "--threads", "1"]


def specdepth(*args: str, cwd: Path, pythonpath: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """The installed `specdepth` command, with `pythonpath` first on PYTHONPATH and `cwd` elsewhere."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    exe = Path(sys.executable).with_name("specdepth")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "specdepth.experiments.cli.main"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def test_the_repository_imports_only_through_the_namespace():
    bad = subprocess.run(["grep", "-rnE", r"^\s*(from|import) (adaptive|policies|workers|experiments)\b",
                          "--include=*.py", "."], cwd=REPO, capture_output=True, text=True)
    assert bad.stdout == "", bad.stdout


def test_a_users_own_experiments_and_policies_packages_do_not_shadow_specdepth(tmp_path):
    for name in ("experiments", "policies", "adaptive", "workers"):  # a research repo's own packages
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('the user package was imported')\n")
    listed = specdepth("policies", cwd=tmp_path, pythonpath=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "dspark" in listed.stdout
    out = specdepth("generate", "--prompt", "def f(x):", *QUICK, cwd=tmp_path, pythonpath=tmp_path)
    assert out.returncode == 0, out.stderr


def test_the_readmes_custom_policy_runs_from_the_users_folder(tmp_path):
    readme = (REPO / "README.md").read_text()
    start = readme.index("```python\n# mypolicies.py")
    src = readme[start + len("```python\n"): readme.index("```", start + 10)]
    assert "from specdepth.policies.base import DepthPolicy" in src
    (tmp_path / "mypolicies.py").write_text(src)
    out = specdepth("generate", "--prompt", "def f(x):", "--policy", "mypolicies:Confident", *QUICK,
                    cwd=tmp_path, pythonpath=tmp_path / "elsewhere")  # found in the working directory
    assert out.returncode == 0, out.stderr
    assert "Confident" in out.stderr or "confident" in out.stderr


@pytest.mark.skipif(os.environ.get("SPECDEPTH_SKIP_WHEEL") == "1", reason="SPECDEPTH_SKIP_WHEEL=1")
def test_the_wheel_holds_one_top_level_name_and_works_without_the_checkout(tmp_path):
    """`pip install .` (a plain, non-editable install) from the wheel it builds: every module is
    under specdepth/, the bundled pair travels with it, and no top-level `adaptive` is importable."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next(tmp_path.glob("specdepth-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"specdepth"}, tops
    assert "specdepth/workers/bundled_pair/target.safetensors" in names
    ours = {f"specdepth/{p.relative_to(REPO).as_posix()}" for d in ("adaptive", "policies", "workers", "experiments")
            for p in (REPO / d).rglob("*.py")}
    assert not ours - set(names), sorted(ours - set(names))  # every subpackage is packaged
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = ("import specdepth.adaptive.engine as e, specdepth.workers.bundled as b; print(e.__file__); "
             "b.load_pair(device='cpu')\n"
             "import importlib\ntry:\n    importlib.import_module('adaptive')\n"
             "except ImportError:\n    print('no top-level adaptive')")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith(str(site)) and "no top-level adaptive" in out.stdout
