"""Comparing two arms by the paper's protocol (Section 3.3, Appendix A).

Step time is the median over steady steps; the speedup S = T_baseline / T_ours is reported with a
95% percentile bootstrap over steady steps (10,000 resamples), per step and per processed token;
"ours faster" needs both lower bounds above 1.111 and equal work (per-step mean prompt length
within 0.5 tokens, mean and longest output lengths within [0.8, 1.25], truncation shares within
10 points). This module reads records (dicts from metrics.jsonl); it never imports jax.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np

VERDICT_MARGIN = 1.111


@dataclasses.dataclass(frozen=True)
class Ratio:
    value: float  # median(baseline) / median(ours)
    low: float
    high: float


def bootstrap_ratio(
    baseline: Sequence[float], ours: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> Ratio:
    """Median ratio baseline/ours with a 95% percentile bootstrap interval (steps resampled)."""
    a, b = np.asarray(baseline, float), np.asarray(ours, float)
    rng = np.random.default_rng(seed)
    ratios = np.median(rng.choice(a, (resamples, a.size)), axis=1) / np.median(
        rng.choice(b, (resamples, b.size)), axis=1
    )
    low, high = np.percentile(ratios, [2.5, 97.5])
    return Ratio(float(np.median(a) / np.median(b)), float(low), float(high))


def equal_work(baseline: Sequence[dict], ours: Sequence[dict]) -> list[str]:
    """Section 3.3's equal-work checks on step records; returns the violations (empty = equal)."""
    problems = []
    for a, b in zip(baseline, ours, strict=False):
        gap = abs(a["rollout/prompt_tokens_mean"] - b["rollout/prompt_tokens_mean"])
        if gap > 0.5:
            problems.append(f"step {a['step']}: mean prompt length differs by {gap:.2f} tokens")
    for key in ("rollout/completion_tokens_mean", "rollout/completion_tokens_max"):
        ratio = np.mean([r[key] for r in baseline]) / max(np.mean([r[key] for r in ours]), 1e-9)
        if not 0.8 <= ratio <= 1.25:
            problems.append(f"{key} ratio {ratio:.2f} outside [0.8, 1.25]")
    share = abs(
        np.mean([r["rollout/truncated_share"] for r in baseline])
        - np.mean([r["rollout/truncated_share"] for r in ours])
    )
    if share > 0.10:
        problems.append(f"truncation shares differ by {100 * share:.0f} points")
    return problems


def verdict(per_step: Ratio, per_token: Ratio, problems: list[str]) -> str:
    if problems:
        return "not comparable: " + "; ".join(problems)
    if per_step.low > VERDICT_MARGIN and per_token.low > VERDICT_MARGIN:
        return f"ours faster (both lower bounds above {VERDICT_MARGIN})"
    return f"no verdict (a lower bound is at or below {VERDICT_MARGIN})"
