"""Cost-to-learn across seeds (Appendix I): a cell's chip-hours with seed-bootstrap intervals,
and Table I2's variants of a ratio between two cells.

A cell is the seed runs of one configuration. Its seeds are pooled by mean score per scored
checkpoint and charged at the first of two consecutive checkpoints that clear the target
(`locoexp.metrics.cost.compute_cell_cost_to_learn`); chip-hours are summed over seeds. Intervals
are 95% percentile bootstraps over seeds with the charged checkpoints held fixed (Appendix I.1).
Table I2's variants: the ratio at each cell's own charged pair, at the same checkpoint (both
charged at each update of the earlier cell's pair), over the steady segment (update 25 to 275 of
348, the same shares for other lengths), and its status against the pre-declared 1.25 bar.
Beside the row, `cli.run_cost` adds Table I6's held-out quality comparison (`quality`).
Update u is the step record u - 1 (steps count from 0). This module never imports jax.
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from locoexp.analysis.quality import format_quality
from locoexp.analysis.runs import Run
from locoexp.errors import ConfigError
from locoexp.metrics.cost import SECONDS_PER_HOUR, CostToLearn, compute_cell_cost_to_learn

BAR = 1.25  # Table I2's pre-declared bar for "supported"
RESAMPLES = 10_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cell:
    label: str
    seeds: list[Run]
    target: float
    chips: int

    def charge(self) -> CostToLearn:
        return compute_cell_cost_to_learn(
            [r.records.checkpoints() for r in self.seeds],
            target=self.target,
            chips=self.chips,
            chip_hour_price_usd=self.seeds[0].records.chip_hour_price_usd,
        )

    def seed_chip_hours_at(self, update: int) -> list[float]:
        """Each seed's chip-hours from job start to scored update `update` (eval excluded)."""
        values = []
        for run in self.seeds:
            checkpoint = next((c for c in run.records.checkpoints() if c.step == update - 1), None)
            if checkpoint is None:
                raise ConfigError(f"{run.run_dir} has no scored checkpoint at update {update}.")
            values.append(self.chips * checkpoint.elapsed_s / SECONDS_PER_HOUR)
        return values

    def seed_chip_hours_between(self, first: int, last: int) -> list[float]:
        """Each seed's chip-hours from update `first` to update `last` (step records)."""
        values = []
        for run in self.seeds:
            elapsed = {r["step"]: r.get("time/elapsed_s") for r in run.steps}
            start, end = elapsed.get(first - 1), elapsed.get(last - 1)
            if start is None or end is None:
                raise ConfigError(
                    f"{run.run_dir} logs no time/elapsed_s at update {first} or {last}."
                )
            values.append(self.chips * (end - start) / SECONDS_PER_HOUR)
        return values


def build_cell(runs: Sequence[Run], *, target: float | None) -> Cell:
    """The seeds of one cell; the target is the runs' own `eval_target` unless given."""
    if not runs:
        raise ConfigError("a cost cell needs at least one run directory.")
    own = {r.get("eval_target") for r in runs}
    if target is None and len(own) != 1:
        raise ConfigError(f"the runs' eval_target values differ ({sorted(own)}): give --target.")
    chips = {r.chips for r in runs}
    if len(chips) != 1 or 0 in chips:
        raise ConfigError(f"a cell's seeds must share a known chip count, found {sorted(chips)}.")
    return Cell(
        label=runs[0].label,
        seeds=list(runs),
        target=float(target if target is not None else own.pop()),
        chips=chips.pop(),
    )


def seed_interval(values: Sequence[float]) -> tuple[float, float]:
    """95% seed bootstrap of the seeds' sum (n x the mean)."""
    v = np.asarray(values, float)
    if v.size < 2 or np.ptp(v) == 0:
        return float(v.sum()), float(v.sum())
    ci = stats.bootstrap(
        (v,), np.mean, n_resamples=RESAMPLES, method="percentile", rng=np.random.default_rng(0)
    ).confidence_interval
    return float(ci.low * v.size), float(ci.high * v.size)


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float]) -> dict:
    """sum(numerator) / sum(denominator) with a 95% bootstrap resampling each cell's seeds."""
    a, b = np.asarray(numerator, float), np.asarray(denominator, float)
    value = float(a.sum() / b.sum())
    if a.size < 2 or b.size < 2:
        return {"value": value, "low": value, "high": value}
    ci = stats.bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.mean(x, axis=axis) / np.mean(y, axis=axis),
        n_resamples=RESAMPLES,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(0),
    ).confidence_interval
    return {"value": value, "low": float(ci.low), "high": float(ci.high)}


def bar_status(low: float, high: float, *, bar: float = BAR) -> str:
    """Table I2's status of an interval against the pre-declared bar."""
    if low > bar:
        return "supported"
    if high < bar:
        return "not supported"
    return "on the bar"


def steady_updates(run: Run) -> tuple[int, int]:
    """Table I2's steady segment, update 25 to 275 of 348: the same shares of the run's steps,
    ending at its first scored update."""
    steps = int(run.get("steps", 0))
    scored = sorted(run.get("eval_at_updates") or [steps])
    return max(1, math.ceil(steps * 25 / 348)), scored[0]


def cell_report(cell: Cell) -> dict[str, Any]:
    """One cell: the charged pair, chip-hours summed over seeds [seed bootstrap]."""
    cost = cell.charge()
    report: dict[str, Any] = {"cell": cell.label, "seeds": len(cell.seeds), **cost.as_metrics()}
    if cost.charged_step is not None:  # reached
        update = cost.charged_step + 1
        pair = _scored_updates(cell)
        report["charged_pair"] = [update, next(u for u in pair if u > update)]
        report["chip_hours_interval"] = seed_interval(cell.seed_chip_hours_at(update))
    return report


def _scored_updates(cell: Cell) -> list[int]:
    return [c.step + 1 for c in cell.seeds[0].records.checkpoints()]


def compare_cells(ours: Cell, against: Cell) -> dict:
    """Table I2's row: `against` over `ours` at each cell's own pair, at the same checkpoint,
    over the steady segment, and the status of the interval against the 1.25 bar."""
    a, b = cell_report(against), cell_report(ours)
    row: dict[str, Any] = {"ours": b, "against": a}
    if not (a["cost/reached"] and b["cost/reached"]):
        row["status"] = "not charged: a cell does not reach its target"
        return row
    row["ratio"] = ratio_interval(
        against.seed_chip_hours_at(a["charged_pair"][0]),
        ours.seed_chip_hours_at(b["charged_pair"][0]),
    )
    earlier = min(a["charged_pair"], b["charged_pair"])
    row["same_checkpoint"] = [
        ratio_interval(against.seed_chip_hours_at(u), ours.seed_chip_hours_at(u))["value"]
        for u in earlier
    ]
    first, last = steady_updates(ours.seeds[0])
    row["steady_updates"] = [first, last]
    row["steady"] = ratio_interval(
        against.seed_chip_hours_between(first, last), ours.seed_chip_hours_between(first, last)
    )["value"]
    row["status"] = bar_status(row["ratio"]["low"], row["ratio"]["high"])
    return row


def format_cost(report: dict) -> str:
    """The table a person reads (one cell, or Table I2's row for two)."""
    cells = [report] if "cell" in report else [report["ours"], report["against"]]
    lines = []
    for c in cells:
        line = f"{c['cell']}: {c['seeds']} seed(s), target {c['cost/target']}: {c['cost/status']}"
        if c["cost/reached"]:
            low, high = c["chip_hours_interval"]
            line += (
                f", charged at updates {c['charged_pair'][0]}/{c['charged_pair'][1]}, "
                f"{c['cost/chip_hours']:.4g} chip-hours [{low:.4g}, {high:.4g}]"
            )
        lines.append(line)
    if "ratio" in report:
        r = report["ratio"]
        same = " / ".join(f"{v:.3f}" for v in report["same_checkpoint"])
        lines += [
            f"ratio against/ours: {r['value']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
            f" (seed bootstrap, charged checkpoints fixed)",
            f"same checkpoint: {same}; steady (updates {report['steady_updates'][0]}-"
            f"{report['steady_updates'][1]}): {report['steady']:.3f}",
            f"status against the {BAR} bar: {report['status']}",
        ]
    elif "status" in report:
        lines.append(report["status"])
    if "quality" in report:
        lines.append(format_quality(report["quality"]))
    return "\n".join(lines)
