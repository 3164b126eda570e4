"""GSM8K through the `datasets` path users run, on the real rows of ../shared/data/gsm8k."""

import numpy as np
import pytest
from dataset_options import completion, dataset_option, prompt_length_stats, shared_data

from locoexp.dataset.build import build_task
from locoexp.dataset.config import DatasetKind
from locoexp.tokenizer.qwen3 import IM_END_ID


@pytest.fixture(scope="module")
def task():
    folder = shared_data("gsm8k")
    config = dataset_option(
        "gsm8k", data_files=str(folder / "train.jsonl"), eval_data_files=str(folder / "test.jsonl")
    )
    return build_task(config)


def test_table1_defaults():
    config = dataset_option("gsm8k")
    assert config.kind is DatasetKind.gsm8k
    assert (config.prompts_per_step, config.samples_per_prompt) == (128, 16)
    assert (config.max_prompt_tokens, config.max_new_tokens, config.thinking) == (512, 2048, False)
    assert (config.path, config.name) == ("openai/gsm8k", "main")
    assert config.revision.startswith("740312ad")


def test_all_rows_load_with_the_held_out_test_split(task):
    assert len(task.train) == 7473 and len(task.eval) == 1319
    assert [e.id for e in task.eval[:3]] == [0, 1, 2]
    assert task.tokenizer.eos_id == IM_END_ID


def test_prompt_lengths_in_qwen3_tokens(task):
    lengths = prompt_length_stats(task, "GSM8K train")
    assert task.long_prompts == 0  # no GSM8K prompt reaches the 512-token cap
    assert lengths.min() >= 30 and 70 <= lengths.mean() <= 110 and lengths.max() < 300


def test_prompts_are_chat_rendered_with_thinking_off(task):
    text = task.tokenizer.decode(task.train[0].prompt_tokens)
    assert text.startswith("<|im_start|>user\nNatalia sold clips to 48 of her friends")
    assert text.endswith("\\boxed{}.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert task.train[0].answer == "72"


def test_gold_answers_score_one_and_perturbed_zero(task):
    examples = task.eval
    gold = task.score(
        examples, [completion(task.tokenizer, f"So \\boxed{{{e.answer}}}") for e in examples]
    )
    assert gold.dtype == np.float32 and gold.shape == (1319,)
    assert gold.min() == 1.0 and task.is_correct(gold).all()
    sample = examples[:200]
    wrong = [completion(task.tokenizer, f"\\boxed{{{int(e.answer) + 1}}}") for e in sample]
    assert task.score(sample, wrong).max() == 0.0


def test_reference_solutions_score_one(task):
    import datasets

    rows = datasets.load_dataset(
        "json", data_files=str(shared_data("gsm8k") / "test.jsonl"), split="train[:100]"
    )
    solutions = [completion(task.tokenizer, row["answer"]) for row in rows]
    assert task.score(task.eval[:100], solutions).min() == 1.0


def test_equivalent_forms_score_one(task):
    big = next(e for e in task.eval if len(e.answer) >= 4 and e.answer.isdigit())
    with_commas = f"{int(big.answer):,}"
    forms = [
        f"The answer is {with_commas}.",
        f"\\boxed{{{with_commas}}}",
        f"#### {big.answer}",
        f"$\\boxed{{{big.answer}.0}}$",
    ]
    assert (
        task.score([big] * len(forms), [completion(task.tokenizer, f) for f in forms]).min() == 1.0
    )


def test_unfinished_and_empty_responses_score_zero(task):
    example = task.eval[0]
    cut = task.tokenizer.encode(f"Let me think about {example.answer}")[:3]  # no EOS: capped
    responses = [np.asarray(cut, np.int32), np.asarray([task.tokenizer.eos_id], np.int32)]
    assert task.score([example, example], responses).tolist() == [0.0, 0.0]


def test_process_pool_rewards_equal_in_process_rewards(task):
    folder = shared_data("gsm8k")
    pooled = build_task(
        dataset_option(
            "gsm8k", data_files=str(folder / "test.jsonl"), max_train_rows=64, reward_workers=2
        )
    )
    examples = pooled.train
    responses = [
        completion(pooled.tokenizer, f"\\boxed{{{e.answer if e.id % 3 else 0}}}") for e in examples
    ]
    try:
        np.testing.assert_array_equal(
            pooled.score(examples, responses), task.score(examples, responses)
        )
    finally:
        pooled.scorer.close()
