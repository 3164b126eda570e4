"""A 2-step pulse of `locoexp.main.run` on the default config: it completes and leaves the
documented records (README, "What a run leaves behind")."""

import json
from pathlib import Path

import pytest

from locoexp.compose import compose_config
from locoexp.main import run as run_grpo
from locoexp.metrics.run_records import read_metrics_jsonl

CONF = Path(__file__).resolve().parents[1] / "conf"
PHASES = ("admission", "generation", "reward", "pack", "train", "publish", "log")
STEP_KEYS = {
    "step",
    "timing/step_s",
    "timing/unaccounted_s",
    "timing/compile_s",
    *(f"timing/{p}_s" for p in PHASES),
    "rollout/reward_mean",
    "rollout/tokens_in",
    "rollout/tokens_out",
    "rollout/completion_tokens_mean",
    "rollout/completion_tokens_max",
    "rollout/truncated_share",
    "rollout/decode_iterations",
    "train/loss",
}


@pytest.mark.slow
def test_two_step_pulse_writes_metrics_and_summary(tmp_path):
    config = compose_config(["steps=2"])
    summary = run_grpo(config, run_dir=tmp_path, progress=False)

    records = read_metrics_jsonl(tmp_path / "metrics.jsonl")
    steps = [r for r in records if "eval/accuracy" not in r]
    evals = [r for r in records if "eval/accuracy" in r]
    assert [r["step"] for r in steps] == [0, 1]
    for record in steps:
        assert record.keys() >= STEP_KEYS, STEP_KEYS - record.keys()
        assert 0.0 <= record["rollout/reward_mean"] <= 1.0
        assert 0.0 <= record["rollout/truncated_share"] <= 1.0
        assert record["rollout/tokens_out"] > 0
        phases = sum(record[f"timing/{p}_s"] for p in PHASES) + record["timing/unaccounted_s"]
        assert phases == pytest.approx(record["timing/step_s"], rel=1e-6)
    assert steps[0]["timing/compile_s"] > 0  # step 0 runs every program first: compile events
    assert len(evals) == 1 and evals[0]["step"] == 1
    assert 0.0 <= evals[0]["eval/accuracy"] <= 1.0 and evals[0]["eval/seconds"] > 0

    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["steps"] == summary["steps"] == 2
    for key in ("reward_first5", "reward_last5", "eval_accuracy", "wall_s"):
        assert key in written, key
    assert written["eval_accuracy"] == evals[0]["eval/accuracy"]
