"""NuminaMath-CoT through `datasets` (csv builder) on the 250 real cn_k12 rows in ../shared/data."""

import re

import datasets
import pytest
from dataset_options import completion, dataset_option, prompt_length_stats, shared_data

from locoexp.dataset.build import build_task
from locoexp.reward.math import extract_last_boxed


@pytest.fixture(scope="module")
def task():
    files = shared_data("numinamath_cot") / "cn_k12_math_problems_weak_solutions_250.csv"
    return build_task(dataset_option("numinamath_cot", data_files=str(files)))


def test_table1_defaults():
    config = dataset_option("numinamath_cot")
    assert (config.prompts_per_step, config.samples_per_prompt) == (256, 8)
    assert (config.max_prompt_tokens, config.max_new_tokens, config.thinking) == (4096, 8192, True)


def test_every_row_has_a_boxed_gold_and_no_held_out_files_means_no_eval(task):
    assert len(task.train) == 250 and task.eval == []


def test_prompt_lengths_in_qwen3_tokens(task):
    lengths = prompt_length_stats(task, "NuminaMath-CoT (cn_k12, 250 rows)")
    assert task.long_prompts == 0 and lengths.min() >= 30 and 80 <= lengths.mean() <= 200
    assert lengths.max() < 4096


def test_prompts_leave_thinking_to_the_model(task):
    text = task.tokenizer.decode(task.train[0].prompt_tokens)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")


def test_reference_solutions_after_thinking_score_one(task):
    files = shared_data("numinamath_cot") / "cn_k12_math_problems_weak_solutions_250.csv"
    rows = datasets.load_dataset("csv", data_files=str(files), split="train")
    assert [extract_last_boxed(r["solution"]) for r in rows] == [e.answer for e in task.train]
    responses = [
        completion(task.tokenizer, f"<think>\nWork.\n</think>\n\n{r['solution']}") for r in rows
    ]
    rewards = task.score(task.train, responses)
    print(f"\nNuminaMath reference solutions scored 1: {int(rewards.sum())}/250")
    assert rewards.mean() >= 0.98  # math-verify may not parse every free-form gold (tuples of sets)


def test_boxed_gold_scores_one_and_perturbed_or_unfinished_zero(task):
    numeric = [e for e in task.train if re.fullmatch("-?[0-9]+", e.answer)][:40]
    assert len(numeric) >= 10
    boxed = [completion(task.tokenizer, f"<think>x</think>\\boxed{{{e.answer}}}") for e in numeric]
    assert task.score(numeric, boxed).min() == 1.0
    wrong = [
        completion(task.tokenizer, f"<think>x</think>\\boxed{{{int(e.answer) + 7}}}")
        for e in numeric
    ]
    assert task.score(numeric, wrong).max() == 0.0
    unfinished = [completion(task.tokenizer, f"<think>\\boxed{{{e.answer}}}") for e in numeric]
    assert task.score(numeric, unfinished).max() == 0.0
