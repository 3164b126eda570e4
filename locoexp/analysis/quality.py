"""Held-out quality between two cells (Appendix I, Table I6): did the faster stack learn as well?

Each seed's score is its held-out accuracy averaged over named scored updates (Table I6: updates
275 and 300, the first two of Table I3's scored checkpoints; by default the first two of the
runs' `eval_at_updates`). The difference is `against` minus `ours` in percentage points with the
95% Welch interval over seeds ("n v n" runs per cell), and it is read against the floor, the
evaluation noise of one checkpoint: one binomial standard error of an accuracy on the held-out
rows, sqrt(p(1 - p) / n), 0.98 pp at 85% of GSM8K's 1,319 test rows (Table I6's ~1 pp). A
difference below the floor "matches within evaluation noise" (Appendix I.2). This module reads
records, never imports jax.
"""

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from locoexp.analysis.runs import Run
from locoexp.errors import ConfigError

UPDATES_SCORED = 2  # Table I6: the mean of updates 275 and 300
TWO_CELLS = (
    "Table I6's held-out comparison needs two cells: give the other cell's seeds with "
    "--against RUN [RUN ...] (or --against-select KEY=VALUE)."
)


def quality_updates(runs: Sequence[Run], given: Sequence[int]) -> list[int]:
    """The updates each seed is scored at: `given`, else the first two `eval_at_updates` that
    every run names."""
    if given:
        return sorted(given)
    named = [set(r.get("eval_at_updates") or []) for r in runs]
    shared = sorted(set.intersection(*named)) if named else []
    if not shared:
        raise ConfigError(
            "Table I6's held-out comparison needs scored updates, and the runs share no "
            "eval_at_updates: give --quality-at UPDATE [UPDATE ...], e.g. --quality-at 275 300."
        )
    return shared[:UPDATES_SCORED]


def seed_scores(runs: Sequence[Run], updates: Sequence[int]) -> list[float]:
    """Each seed's held-out accuracy, the mean over `updates` (update u: checkpoint step u-1)."""
    scores = []
    for run in runs:
        by_update = {c.step + 1: c.score for c in run.records.checkpoints()}
        missing = [u for u in updates if u not in by_update]
        if missing:
            raise ConfigError(
                f"{run.run_dir} has no held-out accuracy (eval/accuracy) at update {missing[0]}: "
                f"Table I6 scores every seed at updates {', '.join(map(str, updates))}; give "
                "--quality-at with updates every seed was scored at."
            )
        scores.append(float(np.mean([by_update[u] for u in updates])))
    return scores


def eval_rows(runs: Sequence[Run], given: int | None) -> int | None:
    """Held-out rows scored per checkpoint: `given`, else the runs' shared `dataset.eval_size`;
    None when unknown (the whole split, whose size the records do not carry)."""
    if given is not None:
        if given < 1:
            raise ConfigError(f"--eval-rows={given} must be a positive number of held-out rows.")
        return given
    sizes = {r.get("dataset.eval_size") for r in runs}
    return int(sizes.pop()) if len(sizes) == 1 and None not in sizes else None


def compare_quality(
    ours: Sequence[Run],
    against: Sequence[Run],
    *,
    updates: Sequence[int] = (),
    rows: int | None = None,
) -> dict[str, Any]:
    """Table I6's row: `against` minus `ours` in pp [95% Welch over seeds], n v n, the floor
    and the verdict."""
    if not ours or not against:
        raise ConfigError(TWO_CELLS)
    scored = quality_updates([*ours, *against], updates)
    a, b = seed_scores(against, scored), seed_scores(ours, scored)
    row: dict[str, Any] = {
        "updates": scored,
        "runs": [len(a), len(b)],
        "difference_pp": 100 * (float(np.mean(a)) - float(np.mean(b))),
        "interval_pp": _welch_pp(a, b),
    }
    n = eval_rows([*ours, *against], rows)
    p = float(np.mean(a + b))
    row["floor_pp"] = None if n is None else 100 * math.sqrt(p * (1 - p) / n)
    row["verdict"] = quality_verdict(row["difference_pp"], row["interval_pp"], row["floor_pp"])
    return row


def _welch_pp(a: Sequence[float], b: Sequence[float]) -> list[float] | None:
    """95% Welch interval of mean(a) - mean(b) in pp; None below two seeds per cell."""
    if len(a) < 2 or len(b) < 2:
        return None
    if np.ptp(a) == 0 and np.ptp(b) == 0:  # no spread: the difference is exact
        d = 100 * (float(np.mean(a)) - float(np.mean(b)))
        return [d, d]
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    return [100 * float(ci.low), 100 * float(ci.high)]


def quality_verdict(
    difference_pp: float, interval_pp: list[float] | None, floor_pp: float | None
) -> str:
    """Appendix I.2's reading: below the floor of one checkpoint, quality matches within
    evaluation noise; above it, the interval says whether the cells differ."""
    size = abs(difference_pp)
    unknown = "" if floor_pp is not None else " (floor unknown: give --eval-rows)"
    if floor_pp is not None and size < floor_pp:
        return (
            f"matches within evaluation noise ({size:.2f} pp is below the {floor_pp:.2f} pp "
            "floor of one checkpoint)"
        )
    if interval_pp is None:
        return f"no verdict (the Welch interval needs two seeds per cell){unknown}"
    if interval_pp[0] <= 0 <= interval_pp[1]:
        return f"no verdict (the Welch interval includes 0){unknown}"
    higher = "against higher" if difference_pp > 0 else "ours higher"
    beyond = unknown or f", beyond the {floor_pp:.2f} pp floor and the interval"
    return f"{higher} by {size:.2f} pp{beyond}"


def format_quality(row: dict[str, Any]) -> str:
    low_high = row["interval_pp"]
    interval = "" if low_high is None else f" [{low_high[0]:+.2f}, {low_high[1]:+.2f}]"
    floor = "unknown" if row["floor_pp"] is None else f"{row['floor_pp']:.2f} pp"
    return (
        f"held-out quality (Table I6), against - ours at updates "
        f"{'/'.join(map(str, row['updates']))}: {row['difference_pp']:+.2f} pp{interval} "
        f"({row['runs'][0]} v {row['runs'][1]}), floor {floor}: {row['verdict']}"
    )
