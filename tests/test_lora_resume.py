"""`adapter=lora` runs survive: the checkpoint carries the adapters and the embedding trained in
full (`adapter.modules_to_save`), with their AdamW state and KL reference; a resumed run
continues with the uninterrupted run's losses, and the final export holds the merged policy
with its PEFT adapter beside it."""

import json

import numpy as np
import pytest

from locoexp.checkpoint.export import ADAPTER_DIR, policy_directory
from locoexp.compose import compose_config
from locoexp.main import run
from locoexp.metrics.run_records import read_metrics_jsonl

pytestmark = pytest.mark.slow
COMMON = [
    "logger=none", "seed=0", "eval_every_steps=0", "checkpoint_every_steps=1",
    "dataset.prompts_per_step=4", "dataset.samples_per_prompt=4",
    "dataset.synthetic.held_out_size=8",
    "adapter=lora", "adapter.rank=8", "adapter.alpha=16", "algo.learning_rate=3e-2",
    "adapter.modules_to_save=[embed_tokens]", "algo.kl_coef=0.05",
]  # fmt: skip


def _losses(run_dir) -> list[float]:
    records = read_metrics_jsonl(run_dir / "metrics.jsonl")
    return [r["train/loss"] for r in records if "eval/accuracy" not in r]


def test_resumed_lora_run_continues_like_the_uninterrupted_one(tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run(compose_config([*COMMON, "steps=4"]), run_dir=whole, progress=False)
    run(compose_config([*COMMON, "steps=2"]), run_dir=resumed, progress=False)
    run(compose_config([*COMMON, "steps=4"]), run_dir=resumed, progress=False)
    np.testing.assert_allclose(_losses(resumed), _losses(whole), rtol=1e-5, atol=1e-6)
    exported = policy_directory(resumed, updates=None)
    assert (exported / "model.safetensors").is_file()
    config = json.loads((exported / ADAPTER_DIR / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 8, 16.0)
    assert config["modules_to_save"] == ["embed_tokens"] and config["ensure_weight_tying"]
