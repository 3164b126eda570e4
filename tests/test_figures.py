"""tools/figures.py draws every panel from crafted run directories, as a user runs it."""

import json
import subprocess
import sys
from pathlib import Path

from PIL import Image

from locoexp.metrics.panels import PHASES
from locoexp.metrics.run_records import read_run

ROOT = Path(__file__).resolve().parents[1]


def write_run_dir(run_dir: Path, *, placement: str, hosts: int, seconds_per_step: float) -> None:
    """A run directory as the step engine leaves it: Hydra's config and metrics.jsonl."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(
        f"placement:\n  kind: {placement}\nhardware:\n  hosts: {hosts}\n  chips_per_host: 4\n"
        "  chip_hour_price_usd: 2.0\nsteps: 6\n"
    )
    lines = []
    for step in range(6):
        phases = {f"timing/{phase}_s": seconds_per_step / len(PHASES) for phase in PHASES}
        lines.append(
            {
                "step": step,
                "time/elapsed_s": 30.0 + seconds_per_step * (step + 1),
                **phases,
                "timing/step_s": seconds_per_step,
                "timing/host_orchestration_share": 0.3,
                "rollout/reward_mean": step / 6,
                "rollout/decode_ms_per_iteration": None,
                "train/loss": 1.0 / (step + 1),
            }
        )
        if step % 2 == 1:
            lines.append(
                {
                    "step": step,
                    "eval/accuracy": 0.3 * (step // 2 + 1),
                    "eval/seconds": 4.0,
                    "eval/examples": 16,
                }
            )
    text = "\n".join(json.dumps(line) for line in lines)
    (run_dir / "metrics.jsonl").write_text(text + '\n{"step": 6, "timing/st')  # cut by a crash


def test_figures_are_drawn_for_every_section(tmp_path):
    runs = [tmp_path / "co-8", tmp_path / "da-16"]
    write_run_dir(runs[0], placement="co", hosts=2, seconds_per_step=2.0)
    write_run_dir(runs[1], placement="da", hosts=4, seconds_per_step=1.5)
    out = tmp_path / "figures"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "figures.py"),
            *map(str, runs),
            "--out",
            str(out),
            "--target",
            "0.55",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    names = {"step_time.png", "learning.png", "cost_to_learn.png"}
    assert {Path(line).name for line in result.stdout.split()} == names
    for name in names:
        with Image.open(out / name) as image:
            assert image.format == "PNG" and image.width > 500


def test_a_run_directory_reads_as_its_group_records_and_checkpoints(tmp_path):
    write_run_dir(tmp_path / "run", placement="co", hosts=2, seconds_per_step=2.0)
    run = read_run(tmp_path / "run")
    assert (run.group, run.chip_hour_price_usd) == ("co, 8 chips", 2.0)
    assert [r["step"] for r in run.steps] == list(range(6))  # the cut last line is skipped
    assert [(c.step, c.elapsed_s) for c in run.checkpoints()] == [(1, 34.0), (3, 38.0), (5, 42.0)]


def test_figures_without_a_target_still_draw_the_cost_section(tmp_path):
    write_run_dir(tmp_path / "run", placement="co", hosts=1, seconds_per_step=1.0)
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "figures.py"),
            str(tmp_path / "run"),
            "--out",
            str(tmp_path / "figures"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "figures" / "cost_to_learn.png").exists()
