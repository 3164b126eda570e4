"""Draw the report's panels as PNG figures from local run directories (no W&B account needed).

    python tools/figures.py RUN_DIR [RUN_DIR ...] --out DIR [--target 0.85] [--warmup-steps 2]

One figure per section of locoexp/metrics/panels.py (the same panels as the W&B workspace):
step_time.png (phase breakdown as stacked bars of steady-step means, one bar per run, and the
per-step timing curves), learning.png (reward and held-out accuracy against the global step) and
cost_to_learn.png (chip-hours to `--target` by the Appendix I.1 rule, and held-out accuracy
against chip-hours spent). Runs are coloured by group: placement and chips.
"""

import argparse
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt

from locoexp.metrics.cost import SECONDS_PER_HOUR, compute_cost_to_learn
from locoexp.metrics.panels import PHASES, SECTIONS, STEP_KEY, Panel, PanelKind
from locoexp.metrics.run_records import RunRecords, read_run


def main(argv: Sequence[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (Hydra outputs)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNG files")
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help="held-out score to charge cost-to-learn at (e.g. 0.85)",
    )
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=2,
        help="first steps left out of the steady-step means (compilation: step 0 compiles "
        "rollout and train, step 1 often recompiles)",
    )
    args = parser.parse_args(argv)
    plt.switch_backend("Agg")  # files only: no display on servers and in CI
    runs = [read_run(run_dir) for run_dir in args.run_dirs]
    args.out.mkdir(parents=True, exist_ok=True)
    written = [
        draw_section(
            section, runs, out=args.out, target=args.target, warmup_steps=args.warmup_steps
        )
        for section in SECTIONS
    ]
    for path in written:
        print(path)
    return written


def draw_section(
    section, runs: list[RunRecords], *, out: Path, target: float | None, warmup_steps: int
) -> Path:
    panels = list(section.panels)
    extra = section.name == "Cost-to-learn"  # plus the curve the bars are read from
    fig, axes = plt.subplots(
        1, len(panels) + extra, figsize=(5 * (len(panels) + extra), 4), squeeze=False
    )
    colors = group_colors(runs)
    for ax, panel in zip(axes[0], panels, strict=False):
        ax.set_title(panel.title)
        ax.set_ylabel(panel.y_label)
        match panel.kind:
            case PanelKind.line:
                draw_lines(ax, panel, runs, colors)
            case PanelKind.stacked:
                draw_phase_bars(ax, runs, warmup_steps=warmup_steps)
            case PanelKind.bar:
                draw_cost_bars(ax, panel, runs, colors, target=target)
    if extra:
        draw_accuracy_vs_chip_hours(axes[0][-1], runs, colors, target=target)
    fig.suptitle(section.name)
    fig.tight_layout()
    path = out / f"{section.name.lower().replace(' ', '_').replace('-', '_')}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def group_colors(runs: list[RunRecords]) -> dict[str, str]:
    groups = sorted({run.group for run in runs})
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {group: cycle[i % len(cycle)] for i, group in enumerate(groups)}


def draw_lines(ax, panel: Panel, runs: list[RunRecords], colors: dict[str, str]) -> None:
    drawn = False
    for run in runs:
        for key in panel.ys:
            points = [
                (r[STEP_KEY], r[key])
                for r in run.steps + run.evals
                if isinstance(r.get(key), int | float)
            ]
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                ax.plot(
                    xs,
                    ys,
                    marker="o" if len(xs) < 20 else None,
                    color=colors[run.group],
                    label=f"{run.group} | {run.name}",
                )
                drawn = True
    ax.set_xlabel("global step")
    finish_axes(ax, drawn, missing=", ".join(panel.ys))


def draw_phase_bars(ax, runs: list[RunRecords], *, warmup_steps: int) -> None:
    """Mean seconds per phase over steady steps: means add up, so each bar's height is the mean
    step time (unaccounted included)."""
    bottoms = [0.0] * len(runs)
    for phase in PHASES:
        heights = [steady_mean(run, f"timing/{phase}_s", warmup_steps) for run in runs]
        ax.bar(range(len(runs)), heights, bottom=bottoms, label=phase)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(range(len(runs)), [f"{run.group}\n{run.name}" for run in runs], fontsize=7)
    ax.set_xlabel(f"mean over steps >= {warmup_steps}")
    finish_axes(ax, any(bottoms), missing="timing/*_s")


def steady_mean(run: RunRecords, key: str, warmup_steps: int) -> float:
    timed = [r for r in run.steps if isinstance(r.get(key), int | float)]  # null: not finite
    values = [r[key] for r in timed if r[STEP_KEY] >= warmup_steps]
    values = values or [r[key] for r in timed]  # a run shorter than its warm-up
    return sum(values) / len(values) if values else 0.0


def draw_cost_bars(
    ax, panel: Panel, runs: list[RunRecords], colors: dict[str, str], *, target: float | None
) -> None:
    if target is None:
        finish_axes(ax, False, missing="--target (the score that charges cost-to-learn)")
        return
    key = panel.ys[0]
    for i, run in enumerate(runs):
        cost = compute_cost_to_learn(
            run.checkpoints(),
            target=target,
            chips=max(run.chips, 1),
            chip_hour_price_usd=run.chip_hour_price_usd,
        ).as_metrics()
        if key in cost:
            ax.bar(i, cost[key], color=colors[run.group])
            ax.annotate(
                f"step {cost['cost/charged_step']}",
                (i, cost[key]),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        else:
            reason = "unpriced" if cost["cost/reached"] else cost["cost/status"]
            ax.annotate(reason, (i, 0), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(runs)), [f"{run.group}\n{run.name}" for run in runs], fontsize=7)
    ax.set_xlabel(f"target {target}: first of two consecutive checkpoints that clear it")


def draw_accuracy_vs_chip_hours(
    ax, runs: list[RunRecords], colors: dict[str, str], *, target: float | None
) -> None:
    ax.set_title("Held-out accuracy against chip-hours")
    drawn = False
    for run in runs:
        checkpoints = run.checkpoints()
        if checkpoints:
            xs = [run.chips * c.elapsed_s / SECONDS_PER_HOUR for c in checkpoints]
            ax.plot(
                xs,
                [c.score for c in checkpoints],
                marker="o",
                color=colors[run.group],
                label=f"{run.group} | {run.name}",
            )
            drawn = True
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label=f"target {target}")
    ax.set_xlabel("chip-hours from job start (evaluation excluded)")
    ax.set_ylabel("accuracy")
    finish_axes(ax, drawn, missing="eval/accuracy")


def finish_axes(ax, drawn: bool, *, missing: str) -> None:
    if drawn:
        ax.legend(fontsize=7)
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


if __name__ == "__main__":
    main()
