"""A resumed run's records: metrics.jsonl cut back to the checkpoint so every step appears once,
the same W&B run continuing its step axis, summary and cost-to-learn over the whole run."""

import json

import pytest
from test_wandb_logger import make_config, read_run, start_in_a_new_second

from locoexp.metrics.config import LoggerConfig, LoggerKind
from locoexp.metrics.cost import Checkpoint, resumed_elapsed_s
from locoexp.metrics.record import cut_back
from locoexp.metrics.run_output import RunOutput
from locoexp.metrics.wandb_logger import RUN_ID_FILE


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch, tmp_path):
    for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "wandb-home"))


def _step(step: int, *, elapsed: float) -> dict:
    return {
        "step": step,
        "rollout/reward_mean": step / 10,
        "timing/step_s": 1.0,
        "time/elapsed_s": elapsed,
    }


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cut_back_keeps_the_steps_before_the_checkpoint_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [_step(s, elapsed=s + 1.0) for s in range(5)]
    records.insert(3, {"step": 2, "eval/accuracy": 0.5, "time/elapsed_s": 3.0})
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 5, "tim')
    kept, dropped = cut_back(path, next_step=3)
    assert [(r["step"], "eval/accuracy" in r) for r in kept] == [
        (0, False),
        (1, False),
        (2, False),
        (2, True),
    ]
    assert [r["step"] for r in dropped] == [3, 4]
    assert _lines(path) == kept
    assert cut_back(tmp_path / "absent.jsonl", next_step=3) == ([], [])


def test_the_resumed_clock_counts_the_redone_steps_and_not_the_gap():
    dropped = [_step(3, elapsed=40.0), _step(4, elapsed=52.5)]
    assert resumed_elapsed_s(30.0, dropped) == 52.5  # App. I.1: chips were held until step 4
    assert resumed_elapsed_s(30.0, []) == 30.0  # stopped cleanly at the checkpoint


def _output(run_dir, *, kind, resume_from=None, scored=()):
    return RunOutput(
        run_dir,
        logger=make_config() if kind == "wandb" else LoggerConfig(kind=LoggerKind.none),
        resolved_config={"steps": 8},
        sweep_name=None,
        steps=8,
        progress=False,
        resume_from=resume_from,
        scored=scored,
    )


def test_a_resumed_run_records_every_step_once_and_summarizes_all_of_them(tmp_path):
    run_dir = tmp_path / "run"
    first = _output(run_dir, kind="wandb")
    for step in range(6):  # killed after step 5; its checkpoint was at next_step=4
        first.export(_step(step, elapsed=10.0 * (step + 1)))
        if step == 2:
            first.on_eval(Checkpoint(step=2, elapsed_s=30.0, score=0.9), seconds=1.0)
    first.close()

    start_in_a_new_second()
    scored = (Checkpoint(step=2, elapsed_s=30.0, score=0.9),)
    second = _output(run_dir, kind="wandb", resume_from=4, scored=scored)
    assert [r["step"] for r in second.dropped] == [4, 5]
    for step in range(4, 8):
        second.export(_step(step, elapsed=60.0 + 10.0 * (step - 3)))
    second.on_eval(Checkpoint(step=7, elapsed_s=100.0, score=0.95), seconds=1.0)
    summary = second.finish({"steps": 4}, target=0.9, chips=2, chip_hour_price_usd=0.0, wall_s=1.0)
    second.close()

    records = _lines(run_dir / "metrics.jsonl")
    steps = [r["step"] for r in records if "eval/accuracy" not in r]
    assert steps == list(range(8))
    assert [r["step"] for r in records if "eval/accuracy" in r] == [2, 7]
    assert summary["steps"] == 8 and summary["reward_first5"] == pytest.approx(0.2)
    assert summary["cost/charged_step"] == 2 and summary["eval_accuracy"] == 0.95

    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    _, runs, history, _ = read_run(run_dir, run_id)
    assert {run.run_id for run in runs} == {run_id}
    logged = [row["step"] for row in history if "timing/step_s" in row]
    assert logged == list(range(8))  # the W&B step axis continues: each step once
