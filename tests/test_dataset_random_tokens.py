"""Workload W1 is a dataset kind (`dataset=random_tokens`): `+experiment=bench_w1` composes the
benchmark's workload, its task is built as every run builds one, and a run of the kind trains,
evaluates and exports like any other (the id tokenizer written as Hugging Face files)."""

import numpy as np
import pytest

from locoexp.compose import compose_config
from locoexp.dataset.config import DatasetKind
from locoexp.main import run as run_grpo
from locoexp.metrics.run_records import read_metrics_jsonl
from locoexp.placement.build import build_checked_task


def test_the_bench_w1_experiment_is_w1_random_ids_over_the_whole_qwen3_vocabulary():
    config = compose_config(["+experiment=bench_w1"])
    d = config.dataset
    assert d.kind is DatasetKind.random_tokens and config.model.vocab_size == 151_936
    assert (d.prompts_per_step, d.samples_per_prompt, d.max_prompt_tokens) == (8, 8, 64)
    assert d.max_new_tokens == 64 and config.rollout.ignore_eos and config.algo.kl_coef == 0
    task = build_checked_task(config.model, config.dataset)
    train = np.stack([e.prompt_tokens for e in task.train])
    held_out = np.stack([e.prompt_tokens for e in task.eval])
    assert train.shape == (64, 64) and held_out.shape == (8, 64) and train.dtype == np.int32
    assert train.min() >= 2 and train.max() < 151_936  # pad 0 and eos 1 never in a prompt
    assert not {tuple(p) for p in held_out} & {tuple(p) for p in train}
    np.testing.assert_array_equal(task.encode_prompt(task.train[3]), train[3])
    completions = [np.array([2, 4, 5, 7]), np.array([6]), np.array([], np.int32)]
    np.testing.assert_allclose(task.score(task.train[:3], completions), [0.5, 1.0, 0.0])


@pytest.mark.slow
def test_a_random_tokens_run_trains_evaluates_and_exports(tmp_path):
    config = compose_config(
        [
            "dataset=random_tokens",
            "dataset.max_prompt_tokens=8",
            "dataset.max_new_tokens=4",
            "dataset.prompts_per_step=4",
            "dataset.samples_per_prompt=2",
            "steps=2",
            "logger=none",
        ]
    )
    summary = run_grpo(config, run_dir=tmp_path, progress=False)
    records = read_metrics_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records if "eval/accuracy" not in r] == [0, 1]
    assert summary["steps"] == 2 and 0.0 <= summary["eval_accuracy"] <= 1.0
    assert (tmp_path / "policy" / "final" / "tokenizer.json").is_file()
