"""The report's three sections (locoexp/metrics/panels.py: the panels the W&B workspace shows)
drawn with matplotlib: step time, learning, cost-to-learn.

The step breakdown is one stacked bar of steady means per `co` or `single_controller` run (the
phases run one after another, so their means add up to the mean step); a `da` run gets two bars,
its rollout branch and its trainer branch, side by side with the step period marked, because
the two overlap in time. The cost panel charges each run at its own `eval_target` unless a
target is given. Never imports jax.
"""

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np

from locoexp.analysis.runs import Run, steady_steps
from locoexp.metrics.cost import SECONDS_PER_HOUR, compute_cost_to_learn
from locoexp.metrics.panels import PHASES, SECTIONS, STEP_KEY, Panel, PanelKind

ROLLOUT_BRANCH = ("load", "admission", "generation", "reward")
TRAINER_BRANCH = ("transfer", "pack", "train", "publish", "log")
WIDE_RANGE = 5.0  # a line panel's largest over smallest value beyond which its y axis is log


def _section(name: str):
    return next(s for s in SECTIONS if s.name == name)


def colors(runs: Sequence[Run]) -> dict[str, str]:
    groups = sorted({run.label for run in runs})
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {g: cycle[i % len(cycle)] for i, g in enumerate(groups)}


def first_launches(runs: Sequence[Run]) -> list[Run]:
    """Each cell's first launch (the cell: `Run.label`): per-step panels of a 3-launch sweep
    would draw every cell three times over (`compare` and Figures 4-6 pool the launches)."""
    first: dict[str, Run] = {}
    for run in runs:
        if run.label not in first or run.launch < first[run.label].launch:
            first[run.label] = run
    return [run for run in runs if first[run.label] is run]


def step_time(runs: Sequence[Run], *, steady: str | None):
    panels = _section("Step time").panels
    shown = first_launches(runs)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2))
    for ax, panel in zip(axes, panels, strict=True):
        ax.set_title(panel.title)
        ax.set_ylabel(panel.y_label)
        if panel.kind is PanelKind.stacked:
            draw_breakdown(ax, shown, steady=steady)
        else:
            draw_lines(ax, panel, shown)
    repeats = " (each cell's first launch)" if len(shown) < len(runs) else ""
    fig.suptitle(f"Step time{repeats}")
    return fig


def learning(runs: Sequence[Run]):
    panels = _section("Learning").panels
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2))
    for ax, panel in zip(axes, panels, strict=True):
        ax.set_title(panel.title)
        ax.set_ylabel(panel.y_label)
        draw_lines(ax, panel, runs)
    fig.suptitle("Learning curve")
    return fig


def draw_lines(ax, panel: Panel, runs: Sequence[Run]) -> None:
    palette, drawn = colors(runs), False
    plotted: list[float] = []
    for run in runs:
        for key in panel.ys:
            points = sorted(
                (r[STEP_KEY], r[key])
                for r in run.steps + run.records.evals
                if isinstance(r.get(key), int | float)
            )
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(
                    xs,
                    ys,
                    marker="o" if len(xs) < 20 else None,
                    color=palette[run.label],
                    label=f"{run.label} | {run.run_dir.name}",
                )
                drawn, plotted = True, plotted + list(ys)
    ax.set_xlabel("global step")
    _log_if_wide(ax, plotted)
    finish(ax, drawn, missing=", ".join(panel.ys))


def _log_if_wide(ax, values: list[float]) -> None:
    """A log y axis where the values span more than WIDE_RANGE (the first steps compile: 115 s
    beside steady steps of 1 s would flatten every steady step onto the floor of a linear axis)."""
    if values and min(values) > 0 and max(values) > WIDE_RANGE * min(values):
        ax.set_yscale("log")


def _mean(run: Run, phase: str, steady: str | None) -> float:
    timings = [r.get(f"timing/{phase}_s") for r in steady_steps(run, override=steady)]
    values = [v for v in timings if isinstance(v, int | float)]
    return float(np.mean(values)) if values else 0.0


def draw_breakdown(ax, runs: Sequence[Run], *, steady: str | None) -> None:
    """Mean seconds per phase over steady steps; `da` as two overlapping branches."""
    x, ticks = 0.0, []
    labelled: set[str] = set()
    for run in runs:
        if run.placement == "da":
            for offset, branch, name in (
                (0, ROLLOUT_BRANCH, "rollout"),
                (0.8, TRAINER_BRANCH, "trainer"),
            ):
                _stack(
                    ax,
                    x + offset,
                    [(p, _mean(run, p, steady)) for p in branch],
                    labelled,
                    width=0.7,
                )
                ticks.append((x + offset, f"{run.arm}\n{name}"))
            period = _mean(run, "step", steady)
            label = None if "period" in labelled else "da step period (branches overlap)"
            labelled.add("period")
            ax.hlines(period, x - 0.4, x + 1.2, color="black", linestyle="--", label=label)
            ax.annotate(
                f"{period:.2f} s",
                (x + 0.4, period),
                fontsize=6,
                ha="center",
                xytext=(0, 2),
                textcoords="offset points",
            )
            x += 2.0
        else:
            _stack(ax, x, [(p, _mean(run, p, steady)) for p in PHASES], labelled, width=0.7)
            ticks.append((x, f"{run.arm}\n{run.run_dir.name}"))
            x += 1.2
    ax.set_xticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=6)
    upright_ticks(ax)
    ax.margins(y=0.12)  # room for the period labels above the tallest bar
    ax.set_xlabel("mean over steady steps")
    finish(ax, bool(ticks), missing="timing/*_s")


def upright_ticks(ax) -> None:
    """Upright x tick labels, so that neighbouring bars' two-line labels (a da run's two
    branches, 0.8 apart) never overlap, however many runs share the panel."""
    ax.tick_params(axis="x", labelrotation=90)


def _stack(ax, x: float, parts, labelled: set, *, width: float) -> None:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    order = list(dict.fromkeys((*PHASES, *ROLLOUT_BRANCH, *TRAINER_BRANCH)))
    bottom = 0.0
    for phase, height in parts:
        label = None if phase in labelled else phase
        labelled.add(phase)
        ax.bar(
            x,
            height,
            bottom=bottom,
            width=width,
            label=label,
            color=cycle[order.index(phase) % len(cycle)],
        )
        bottom += height


def cost_to_learn(runs: Sequence[Run], *, target: float | None):
    fig, (bars, curve) = plt.subplots(1, 2, figsize=(11, 4.2))
    palette = colors(runs)
    for i, run in enumerate(runs):
        own = target if target is not None else float(run.get("eval_target", 0.0) or 0.0)
        cost = compute_cost_to_learn(
            run.records.checkpoints(),
            target=own,
            chips=max(run.chips, 1),
            chip_hour_price_usd=run.records.chip_hour_price_usd,
        )
        if cost.chip_hours is not None and cost.charged_step is not None:  # reached
            bars.bar(i, cost.chip_hours, color=palette[run.label])
            bars.annotate(
                f"target {own:g}\nupdate {cost.charged_step + 1}",
                (i, cost.chip_hours),
                ha="center",
                va="bottom",
                fontsize=6,
            )
        else:
            bars.annotate(
                f"target {own:g}:\n{cost.as_metrics()['cost/status']}",
                (i, 0),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    bars.set_xticks(range(len(runs)), [f"{r.arm}\n{r.run_dir.name}" for r in runs], fontsize=6)
    upright_ticks(bars)
    bars.margins(y=0.15)  # room for the target labels above the tallest bar
    bars.set_ylabel("chip-hours (Appendix I.1)")
    bars.set_title("Chip-hours to the target" + (" (each run's own)" if target is None else ""))
    drawn = False
    for run in runs:
        checkpoints = run.records.checkpoints()
        if checkpoints:
            curve.plot(
                [run.chips * c.elapsed_s / SECONDS_PER_HOUR for c in checkpoints],
                [c.score for c in checkpoints],
                marker="o",
                color=palette[run.label],
                label=f"{run.arm} | {run.run_dir.name}",
            )
            drawn = True
    targets = {target} if target is not None else {run.get("eval_target") for run in runs}
    for t in sorted(t for t in targets if t is not None):
        curve.axhline(t, color="grey", linestyle="--", label=f"target {t:g}")
    curve.set_xlabel("chip-hours from job start (evaluation excluded)")
    curve.set_ylabel("held-out accuracy")
    curve.set_title("Held-out accuracy against chip-hours")
    finish(curve, drawn, missing="eval/accuracy")
    fig.suptitle("Cost-to-learn")
    return fig


def finish(ax, drawn: bool, *, missing: str) -> None:
    if drawn:
        ax.legend(fontsize=6)
    else:
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
