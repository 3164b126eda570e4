"""`python -m locoexp.analysis figures` draws every figure from crafted run directories, as a user
runs it; `da` branches are not stacked; the cost panel charges each run at its own target."""

import json
import subprocess
import sys
from pathlib import Path

import matplotlib
from PIL import Image
from run_dirs import noisy, write_run

from locoexp.analysis import report_panels
from locoexp.analysis.figures import Figure
from locoexp.analysis.runs import find_runs
from locoexp.metrics.run_records import read_run

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PHASES = {
    "admission": 0.1,
    "generation": 1.0,
    "reward": 0.1,
    "pack": 0.1,
    "train": 0.5,
    "publish": 0.1,
    "log": 0.01,
}
DA_PHASES = {
    "load": 0.05,
    "admission": 0.05,
    "generation": 0.6,
    "reward": 0.05,
    "transfer": 0.02,
    "pack": 0.05,
    "train": 0.8,
    "publish": 0.1,
}


def sweep(root: Path) -> Path:
    """A stack comparison and a co-vs-da grid at two chip counts."""
    for hosts in (2, 4):
        write_run(
            root / f"sc-{hosts}",
            noisy(4.0 / hosts, steps=12),
            placement="single_controller",
            levers=False,
            hosts=hosts,
            phases=PHASES,
            extra={"timing/head_interval_s": 0.3, "rollout/decode_ms_per_iteration": 2.1},
        )
        write_run(
            root / f"co-{hosts}",
            noisy(1.5 / hosts, steps=12),
            hosts=hosts,
            phases=PHASES,
            extra={"rollout/decode_s_per_iteration": 0.001},
            evals={9: 0.4, 10: 0.6, 11: 0.7, 12: 0.8},
            eval_target=0.55,
        )
        write_run(
            root / f"da-{hosts}",
            noisy(1.2 / hosts, steps=12),
            placement="da",
            split=0.5,
            hosts=hosts,
            phases=DA_PHASES,
        )
    return root


def test_figures_command_draws_every_figure(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "locoexp.analysis",
            "figures",
            str(sweep(tmp_path / "sweep")),
            "--out",
            str(tmp_path / "figures"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    written = {Path(line).name for line in result.stdout.split()}
    assert written == {f"{figure.value}.png" for figure in Figure}
    for name in written:
        with Image.open(tmp_path / "figures" / name) as image:
            assert image.format == "PNG" and image.width > 400


def test_da_branches_overlap_instead_of_stacking(tmp_path):
    write_run(tmp_path / "da", noisy(1.2, steps=12), placement="da", split=0.5, phases=DA_PHASES)
    fig, ax = plt.subplots()
    report_panels.draw_breakdown(ax, find_runs([tmp_path / "da"]), steady=None)
    tops = [patch.get_y() + patch.get_height() for patch in ax.patches]
    rollout = sum(DA_PHASES[p] for p in report_panels.ROLLOUT_BRANCH)
    trainer = sum(DA_PHASES.get(p, 0.0) for p in report_panels.TRAINER_BRANCH)
    assert max(tops) == max(rollout, trainer)  # the longer branch, not their sum
    plt.close(fig)


def test_cost_panel_uses_each_runs_own_target(tmp_path):
    write_run(
        tmp_path / "co",
        noisy(1.0, steps=12),
        evals={9: 0.4, 10: 0.6, 11: 0.7, 12: 0.8},
        eval_target=0.55,
    )
    fig = report_panels.cost_to_learn(find_runs([tmp_path / "co"]), target=None)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any(t.startswith("target 0.55\nupdate 10") for t in texts), texts
    plt.close(fig)


def test_a_run_directory_reads_as_its_group_records_and_checkpoints(tmp_path):
    write_run(tmp_path / "run", noisy(2.0, steps=6), hosts=2, evals={2: 0.3, 4: 0.6, 6: 0.9})
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "timing/st')  # a last line cut by a crash is skipped
    run = read_run(tmp_path / "run")
    assert run.group == "co, 8 chips"
    assert [r["step"] for r in run.steps] == list(range(6))
    assert [c.step for c in run.checkpoints()] == [1, 3, 5]
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])["step"] == 0


def test_a_run_with_hosts_left_to_the_placement_counts_the_chips_it_ran_on(tmp_path):
    # hardware.hosts: null in Hydra's file: the smallest count the placement needs (co: 1;
    # da at split 0.5: 2), resolved as the run resolved it
    write_run(tmp_path / "co", noisy(2.0, steps=4), hosts=None)
    da = dict(placement="da", split=0.5, levers=False)  # O1 is refused under da
    write_run(tmp_path / "da", noisy(2.0, steps=4), hosts=None, **da)
    assert read_run(tmp_path / "co").group == "co, 4 chips"
    assert read_run(tmp_path / "da").group == "da, 8 chips"


def test_figure_4s_ratio_is_compares_geometric_mean_over_launches(tmp_path):
    # Pathways launches of 2 s and 8 s against LoCoJAX's 1 s: App. A's geometric mean is 4.00x
    # (the ratio of the arithmetic cell means would be 5.00x), as `compare` reports it
    from locoexp.analysis.figures import by_chips  # noqa: PLC0415

    for launch, median in enumerate((2.0, 8.0)):
        write_run(
            tmp_path / f"pw-{launch}",
            noisy(median, spread=0.0),
            placement="single_controller",
            levers=False,
            launch=launch,
        )
        write_run(tmp_path / f"co-{launch}", noisy(1.0, spread=0.0), launch=launch)
    fig = by_chips(find_runs([tmp_path]), steady=None, arms=None, title="Figure 4")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    labels = {ax.get_xlabel() for ax in fig.axes}
    plt.close(fig)
    assert "4.00x" in texts, texts
    assert labels == {"chips"}  # TPU chips; a hardware=cpu run counts CPU hosts


def test_ratio_labels_of_close_steps_do_not_overlap(tmp_path):
    # co_vs_da_cpu's 3-launch sweep: da 0.5 and da 0.75 within 4% of each other (3.37x, 3.25x)
    from locoexp.analysis.figures import by_chips  # noqa: PLC0415

    write_run(tmp_path / "co", noisy(0.676, spread=0.0), placement="co")
    for split, median in ((0.25, 0.099), (0.5, 0.201), (0.75, 0.208)):
        write_run(tmp_path / f"da-{split}", noisy(median, spread=0.0), placement="da", split=split)
    fig = by_chips(find_runs([tmp_path]), steady=None, arms="co_da", title="Figure 6")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for ax in fig.axes for t in ax.texts]
    plt.close(fig)
    assert len(boxes) == 3
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def test_step_time_panels_draw_each_cells_first_launch(tmp_path):
    # a 3-launch sweep drew every cell three times over (12 runs of co_vs_da_cpu: colliding bars)
    for launch in range(3):
        write_run(tmp_path / f"co-{launch}", noisy(0.7), launch=launch)
        write_run(tmp_path / f"da-{launch}", noisy(0.1), placement="da", split=0.25, launch=launch)
    fig = report_panels.step_time(find_runs([tmp_path]), steady=None)
    lines = {ax.get_title(): ax.get_legend_handles_labels()[1] for ax in fig.axes}
    title = fig._suptitle.get_text()
    plt.close(fig)
    assert len(lines["Step time"]) == 2 and all(
        label.endswith("-0") for label in lines["Step time"]
    )
    assert title == "Step time (each cell's first launch)"


def test_cpu_runs_are_counted_in_hosts_not_chips(tmp_path):
    from locoexp.analysis.figures import by_chips  # noqa: PLC0415

    config = {"hardware": {"chip": "cpu", "hosts": 2, "chips_per_host": 1}}
    write_run(tmp_path / "co", noisy(1.0), config=config)
    runs = find_runs([tmp_path])
    assert runs[0].label.endswith("CPU hosts")
    fig = by_chips(runs, steady=None, arms=None, title="Figure 4")
    assert {ax.get_xlabel() for ax in fig.axes} == {"CPU hosts"}
    plt.close(fig)


def _inside(box, canvas) -> bool:
    return (
        box.x0 >= canvas.x0 - 1
        and box.x1 <= canvas.x1 + 1
        and box.y0 >= canvas.y0 - 1
        and box.y1 <= canvas.y1 + 1
    )


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 - 1 and b.x0 < a.x1 - 1 and a.y0 < b.y1 - 1 and b.y0 < a.y1 - 1


def _tick_labels(axis) -> list[tuple[float, object]]:
    return [
        *zip(axis.get_majorticklocs(), axis.get_majorticklabels(), strict=False),
        *zip(axis.get_minorticklocs(), axis.get_minorticklabels(), strict=False),
    ]


def _shown_tick_boxes(axis, renderer) -> list:
    """Window boxes of the tick labels drawn on `axis` (major and minor, within its view)."""
    low, high = sorted(axis.get_view_interval())
    return [
        label.get_window_extent(renderer)
        for loc, label in _tick_labels(axis)
        if low <= loc <= high and label.get_visible() and label.get_text()
    ]


def test_no_figure_clips_a_label_or_overlaps_its_ticks(tmp_path):
    from matplotlib.text import Text  # noqa: PLC0415

    from locoexp.analysis.figures import build  # noqa: PLC0415

    runs = find_runs([sweep(tmp_path / "sweep")])
    for figure in Figure:
        fig = build(figure, runs, target=None, steady=None)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ticks = {
            id(label)
            for ax in fig.axes
            for a in (ax.xaxis, ax.yaxis)
            for _, label in _tick_labels(a)
        }
        for text in fig.findobj(Text):
            if id(text) not in ticks and text.get_visible() and text.get_text().strip():
                box = text.get_window_extent(renderer)
                assert _inside(box, fig.bbox), (figure.value, text.get_text())
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                boxes = _shown_tick_boxes(axis, renderer)
                assert all(_inside(box, fig.bbox) for box in boxes), (figure.value, ax.get_title())
                pairs = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]]
                assert not any(_overlap(a, b) for a, b in pairs), (figure.value, ax.get_title())
        plt.close(fig)


def test_a_step_time_panel_with_a_compile_step_has_a_log_axis(tmp_path):
    times = [120.0] + [1.0 + 0.01 * i for i in range(11)]  # step 0 compiles
    write_run(tmp_path / "co", times, phases=PHASES)
    fig = report_panels.step_time(find_runs([tmp_path / "co"]), steady=None)
    scales = {ax.get_title(): ax.get_yscale() for ax in fig.axes}
    plt.close(fig)
    assert scales["Step time"] == "log"
    assert scales["Step time by phase"] == "linear"
