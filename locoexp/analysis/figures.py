"""The paper's figures as PNG files, drawn from run directories (no W&B account needed).

Which figure reads what:
- step_time, learning, cost_to_learn: the report's panels (locoexp/metrics/panels.py, the same
  as the W&B workspace); the step breakdown draws a `da` run's rollout and trainer branches side
  by side (they overlap in time, so stacking them would add time that is not serial).
- fig3: (A) share of the step by component per model: the profiler's `breakdown/*_share` where
  logged, else the phase shares of the mean steady step; (B) step time against rollout TP,
  relative to each model's fastest TP.
- fig4: steady step time against chips (log-log), one line per arm, one panel per workload.
- fig5: (a) step times of the single controller and LoCoJAX optimized with the head interval;
  (b) the head interval's share of the single controller's step.
- fig6: co against da by split: step time against chips, one panel per workload.
- fig7: (a) admission once per step; (b) decode once per iteration, per arm.
A cell's value is the mean of its launches' steady medians (Appendix A). A panel whose keys no
run logs says so in the panel. Never imports jax.
"""

import enum
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from locoexp.analysis import report_panels as panels
from locoexp.analysis.compare import headline_ratio
from locoexp.analysis.runs import Run, steady_median, steady_steps

PHASES = ("admission", "generation", "reward", "pack", "train", "publish", "log", "unaccounted")
ROLLOUT_BRANCH = ("load", "admission", "generation", "reward")  # a da rollout host's step
TRAINER_BRANCH = ("transfer", "pack", "train", "publish")  # the da trainer's step
BREAKDOWN = ("compute", "network", "host")


class Figure(enum.Enum):
    step_time = "step_time"
    learning = "learning"
    cost_to_learn = "cost_to_learn"
    fig3 = "fig3"
    fig4 = "fig4"
    fig5 = "fig5"
    fig6 = "fig6"
    fig7 = "fig7"


def draw(
    figure: Figure, runs: Sequence[Run], *, out: Path, target: float | None, steady: str | None
) -> Path:
    """`figure` of `runs` as `out/<figure>.png`."""
    fig = build(figure, runs, target=target, steady=steady)
    path = out / f"{figure.value}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def build(figure: Figure, runs: Sequence[Run], *, target: float | None, steady: str | None):
    """`figure` of `runs`, laid out (tight: every label inside the canvas)."""
    match figure:
        case Figure.step_time:
            fig = panels.step_time(runs, steady=steady)
        case Figure.learning:
            fig = panels.learning(runs)
        case Figure.cost_to_learn:
            fig = panels.cost_to_learn(runs, target=target)
        case Figure.fig3:
            fig = fig3(runs, steady=steady)
        case Figure.fig4:
            fig = by_chips(runs, steady=steady, arms=None, title="Figure 4")
        case Figure.fig5:
            fig = fig5(runs, steady=steady)
        case Figure.fig6:
            fig = by_chips(runs, steady=steady, arms="co_vs_da", title="Figure 6")
        case Figure.fig7:
            fig = fig7(runs, steady=steady)
    fig.tight_layout()
    return fig


def cell_value(runs: Sequence[Run], key: str, steady: str | None) -> float | None:
    """Mean over launches of each launch's steady median of `key` (Appendix A)."""
    values = [v for r in runs if (v := steady_median(r, key, override=steady)) is not None]
    return float(np.mean(values)) if values else None


def group(runs: Sequence[Run], *keys) -> dict[tuple, list[Run]]:
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        groups[tuple(k(run) for k in keys)].append(run)
    return dict(sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))))


def no_data(ax, missing: str) -> None:
    ax.text(
        0.5,
        0.5,
        f"no data: {missing}",
        ha="center",
        va="center",
        fontsize=8,
        transform=ax.transAxes,
        wrap=True,
    )


def fig3(runs: Sequence[Run], *, steady: str | None):
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    by_model = group(runs, lambda r: r.model, lambda r: int(r.get("rollout.tensor_parallel", 1)))
    profiled = any(
        "breakdown/compute_share" in rec for r in runs for rec in steady_steps(r, override=steady)
    )
    parts = BREAKDOWN if profiled else PHASES
    labels, left = [], np.zeros(len(by_model))
    for part in parts:
        key = f"breakdown/{part}_share" if profiled else f"timing/{part}_s"
        shares = []
        for cell in by_model.values():
            value = cell_value(cell, key, steady) or 0.0
            step = 1.0 if profiled else (cell_value(cell, "timing/step_s", steady) or 1.0)
            shares.append(100 * value / step)
        a.barh(range(len(by_model)), shares, left=left, label=part)
        left += shares
    labels = [f"{m} TP{t}" for m, t in by_model]
    a.set_yticks(range(len(labels)), labels, fontsize=7)
    a.set_xlabel("share of step (%)")
    a.set_title("(A) share of step by " + ("component (profiler)" if profiled else "phase"))
    a.legend(fontsize=7)
    for model, cells in group(runs, lambda r: r.model).items():
        tps = group(cells, lambda r: int(r.get("rollout.tensor_parallel", 1)))
        points = [
            (tp[0], s)
            for tp, c in tps.items()
            if (s := cell_value(c, "timing/step_s", steady)) is not None
        ]
        if points:
            fastest = min(s for _, s in points)
            b.plot(
                [t for t, _ in points], [s / fastest for _, s in points], marker="o", label=model[0]
            )
    b.set_xscale("log", base=2)
    b.set_xlabel("rollout TP")
    b.set_ylabel("step time / fastest TP's")
    b.set_title("(B) step time against TP")
    b.legend(fontsize=7)
    fig.suptitle("Figure 3: scale study")
    return fig


def by_chips(runs: Sequence[Run], *, steady: str | None, arms: str | None, title: str):
    """Figures 4 and 6: steady step time against chips, one line per arm, log-log."""
    workloads = group(runs, lambda r: r.workload)
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.2), squeeze=False)
    for ax, (workload, cells) in zip(axes[0], workloads.items(), strict=True):
        lines = group(cells, lambda r: r.arm)
        for (arm,), arm_runs in lines.items():
            points = sorted(
                (chips[0], cell_value(c, "timing/step_s", steady))
                for chips, c in group(arm_runs, lambda r: r.chips).items()
            )
            points = [(x, y) for x, y in points if y is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=arm)
        _annotate_ratios(ax, cells, steady)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(cells[0].unit)
        ax.set_ylabel("steady step time (s)")
        ax.set_title(workload[0])
        ax.legend(fontsize=7)
    unit = runs[0].unit
    fig.suptitle(f"{title}: step time against {unit}" + (" (co vs da)" if arms else ""))
    return fig


def _annotate_ratios(ax, runs: Sequence[Run], steady: str | None) -> None:
    """Figure 4's bold numbers: the baseline's step over each other arm's at the largest chips.
    Labels of steps within `_CLOSE` of the one below are lifted a line, so they do not overlap."""
    chips = max(r.chips for r in runs)
    at_top = group([r for r in runs if r.chips == chips], lambda r: r.arm)
    base_arm = ("single_controller",) if ("single_controller",) in at_top else ("co optimized",)
    base = launch_medians(at_top.get(base_arm, []), steady)
    labels = []
    for arm, cell in at_top.items():
        value = cell_value(cell, "timing/step_s", steady)
        ours = launch_medians(cell, steady)
        if base and ours and value and arm != base_arm:
            # compare's basis (Appendix A): the geometric mean over launches
            labels.append((value, f"{headline_ratio(base, ours)['ratio']:.2f}x"))
    lift, below = 0, None
    for value, text in sorted(labels):
        lift = lift + _LINE_PT if below is not None and value < below * _CLOSE else 0
        ax.annotate(
            text,
            (chips, value),
            fontsize=8,
            fontweight="bold",
            xytext=(4, lift),
            textcoords="offset points",
        )
        below = value


_CLOSE, _LINE_PT = 1.15, 9  # steps within 15% share a line's height on a log axis of ~2 decades


def launch_medians(runs: Sequence[Run], steady: str | None) -> list[float]:
    medians = (steady_median(r, "timing/step_s", override=steady) for r in runs)
    return [m for m in medians if m is not None]


def head_interval_key(runs: Sequence[Run]) -> str:
    """Figure 5's head interval where the run logs it, else the admission time (its main part)."""
    logged = any("timing/head_interval_s" in rec for r in runs for rec in r.steps)
    return "timing/head_interval_s" if logged else "timing/admission_s"


def fig5(runs: Sequence[Run], *, steady: str | None):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    single = [r for r in runs if r.placement == "single_controller"]
    key = head_interval_key(single)
    for (arm,), cells in group(runs, lambda r: r.arm).items():
        if arm not in ("single_controller", "co optimized"):
            continue
        points = _by_chips(cells, "timing/step_s", steady)
        if points:
            a.plot(*zip(*points, strict=True), marker="o", label=f"{arm} step")
    head = _by_chips(single, key, steady)
    if head:
        a.plot(*zip(*head, strict=True), marker="s", linestyle="--", label=f"head ({key})")
        steps = dict(_by_chips(single, "timing/step_s", steady))
        shares = [(x, 100 * y / steps[x]) for x, y in head if steps.get(x)]
        b.plot(*zip(*shares, strict=True), marker="s")
    else:
        no_data(b, f"{key} of a single_controller run")
    a.set_xscale("log", base=2)
    a.set_xlabel(runs[0].unit)
    a.set_ylabel("seconds per step")
    a.set_title("(a) step time and head interval")
    a.legend(fontsize=7)
    b.set_xscale("log", base=2)
    b.set_xlabel(runs[0].unit)
    b.set_ylabel("head interval, % of the single controller's step")
    b.set_title("(b) head interval share")
    if key != "timing/head_interval_s":
        fig.text(
            0.01,
            0.01,
            "timing/head_interval_s not logged: admission time shown instead",
            fontsize=7,
        )
    fig.suptitle("Figure 5: head interval against step time")
    return fig


def _by_chips(runs: Sequence[Run], key: str, steady: str | None) -> list[tuple[int, float]]:
    points = [
        (c[0], cell_value(cell, key, steady)) for c, cell in group(runs, lambda r: r.chips).items()
    ]
    return [(x, y) for x, y in points if y is not None]


def decode_ms(run: Run, steady: str | None) -> tuple[float | None, str]:
    """Per-iteration decode time in ms: the decode-only figure when logged, else the
    generation-phase figure (which includes prefill and compiles) and a note saying so."""
    value = steady_median(run, "rollout/decode_ms_per_iteration", override=steady)
    if value is not None:
        return value, "decode only"
    value = steady_median(run, "rollout/decode_s_per_iteration", override=steady)
    return (None if value is None else 1e3 * value), "generation / iterations (incl. prefill)"


def fig7(runs: Sequence[Run], *, steady: str | None):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    cells = group(runs, lambda r: r.label)
    names = [k[0] for k in cells]
    admission = [cell_value(c, "timing/admission_s", steady) or 0.0 for c in cells.values()]
    a.barh(range(len(names)), admission)
    a.set_yticks(range(len(names)), names, fontsize=7)
    a.set_xlabel("seconds per step (slowest admitting process)")
    a.set_title("(a) request admission, once per step")
    decode = [decode_ms(r, steady) for c in cells.values() for r in c[:1]]
    b.barh(range(len(names)), [v or 0.0 for v, _ in decode])
    b.set_yticks(
        range(len(names)),
        [f"{n}\n({basis})" for n, (_, basis) in zip(names, decode, strict=True)],
        fontsize=6,
    )
    b.set_xlabel("milliseconds per decode iteration")
    b.set_title("(b) decode, once per iteration")
    fig.suptitle("Figure 7: the controller's two recurring costs")
    return fig
