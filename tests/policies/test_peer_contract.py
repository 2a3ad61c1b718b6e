"""Every built-in, in a small closed loop: answers of the right shape, type and range; numpy only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specdepth.policies.base import DepthPolicy, DraftContext, StepOutcome
from specdepth.policies.registry import builtin_policies, make_policy
from specdepth.policies.testing import LinearCost, make_plan_ctx

ROOT = Path(__file__).resolve().parents[2]
COST = LinearCost(target_s=0.010, draft_s=0.001, target_per_token_s=0.0002)


def check_budgets(out: np.ndarray, batch: int, max_depth: int) -> None:
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.shape == (batch,)
    assert (out >= 0).all() and (out <= max_depth).all()


def run_loop(policy: DepthPolicy, steps: int, max_depth: int, seed: int = 0) -> None:
    """A toy engine: geometric acceptance (per-sequence rate), sequences finishing and arriving."""
    rng = np.random.default_rng(seed)
    ids = np.arange(6, dtype=np.int64)
    next_id = 6
    for step in range(steps):
        batch = len(ids)
        plan_ctx = make_plan_ctx(batch, step=step, seq_ids=ids, max_depth=max_depth, cost=COST)
        budgets = policy.plan(plan_ctx)
        check_budgets(budgets, batch, max_depth)
        top1 = rng.uniform(0.05, 1.0, (batch, max_depth))  # (B, K)
        drafted = np.zeros(batch, np.int64)
        active = budgets > 0  # (B,) still drafting
        j = 0
        while active.any():
            j += 1
            drafted[active] = j
            table = np.where(np.arange(j)[None, :] < drafted[:, None], top1[:, :j], 0.0)  # (B, j)
            dctx = DraftContext(step, ids, budgets, drafted, table, table, np.zeros_like(table))
            keep = policy.keep_drafting(dctx)
            assert keep.shape == (batch,) and keep.dtype == bool
            active &= keep & (budgets > j)
        accepted = np.minimum(drafted, rng.geometric(1 - 0.6, batch) - 1)  # (B,)
        finished = ids[:1] if step % 3 == 2 else np.zeros(0, np.int64)
        shown = np.where(np.arange(max_depth)[None, :] < drafted[:, None], top1, 0.0)  # (B, K)
        policy.observe(
            StepOutcome(
                step=step,
                seq_ids=ids,
                budgets=budgets,
                drafted=drafted,
                verified=drafted,
                accepted=accepted,
                top1=shown,
                conf=shown,
                step_time_s=0.02,
                draft_time_s=0.005,
                target_time_s=0.015,
                context_lens=plan_ctx.context_lens,
                finished=finished,
            )
        )
        if len(finished):
            ids = np.append(ids[1:], [next_id, next_id + 1][: 1 + step % 2])  # the batch size drifts
            next_id += 2


LIVE = sorted(n for n, cls in builtin_policies().items() if not getattr(cls, "replay_only", False))


@pytest.mark.parametrize("max_depth", [1, 4, 8])
@pytest.mark.parametrize("name", LIVE)
def test_closed_loop_contract(name: str, max_depth: int) -> None:
    run_loop(make_policy(name), steps=40, max_depth=max_depth)


@pytest.mark.parametrize("name", LIVE)
def test_empty_and_large_batches(name: str) -> None:
    policy = make_policy(name)
    for batch in (0, 1, 300):
        check_budgets(policy.plan(make_plan_ctx(batch, max_depth=6, cost=COST)), batch, 6)


def test_policies_import_numpy_only() -> None:
    code = (
        "import sys; from specdepth.policies.registry import list_policies, make_policy; "
        "import specdepth.policies.testing; [make_policy(n) for n, _, _ in list_policies()]; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray') or "
        "m.split('.')[:2] in (['specdepth', 'adaptive'], ['specdepth', 'workers'], ['specdepth', 'experiments'])); "
        "print(bad); sys.exit(bool(bad))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
