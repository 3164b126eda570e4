"""SWE-agent trajectories through `datasets` (json builder) on real rows in ../shared/data.

A seeded sample of 40 of the 250 trajectory files keeps the test short; they are linked (not
copied) into a temporary folder and loaded with the same glob a user passes in data_files.
"""

import json
import random

import numpy as np
import pytest
from dataset_options import completion, dataset_option, prompt_length_stats, shared_data

from locoexp.dataset.build import build_task
from locoexp.dataset.config import LongPrompts
from locoexp.dataset.prompts import encode_chat_prompt, encode_step_prompts
from locoexp.dataset.swe_task import trajectory_messages
from locoexp.reward.swe import extract_command
from locoexp.tokenizer.qwen3 import Qwen3Tokenizer

SAMPLE = 40


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory):
    files = sorted((shared_data("swe_agent_trajectories") / "trajectories").glob("*.json"))
    folder = tmp_path_factory.mktemp("swe")
    for path in random.Random(0).sample(files, SAMPLE):
        (folder / path.name).symlink_to(path)
    return folder


@pytest.fixture(scope="module")
def task(sample_dir):
    return build_task(dataset_option("swe_agent", data_files=str(sample_dir / "*.json")))


def test_table1_defaults():
    config = dataset_option("swe_agent")
    assert (config.prompts_per_step, config.samples_per_prompt) == (256, 8)
    assert (config.max_prompt_tokens, config.max_new_tokens, config.thinking) == (
        15360,
        1024,
        False,
    )
    assert config.path == "nebius/SWE-agent-trajectories" and config.eval_split is None


def test_prompt_lengths_in_qwen3_tokens_are_prefill_heavy(task):
    lengths = prompt_length_stats(task, f"SWE-agent ({SAMPLE} trajectories, one prompt per action)")
    assert len(task.train) > 10 * SAMPLE and task.eval == []
    assert lengths.min() >= 1000 and np.median(lengths) >= 3000 and lengths.max() <= 15360
    assert task.long_prompts > 0  # late steps of long trajectories exceed the cap and are dropped


def test_prompt_is_the_trajectory_before_the_action(task):
    text = task.tokenizer.decode(task.train[0].prompt_tokens)
    assert text.startswith("<|im_start|>system\nSETTING: You are an autonomous programmer")
    assert "<|im_start|>user\nWe're currently solving the following issue" in text
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert extract_command(task.train[0].answer) is not None


def test_incremental_prefix_tokens_equal_full_rendering(sample_dir):
    tokenizer = Qwen3Tokenizer()
    row = json.loads(sorted(sample_dir.glob("*.json"))[0].read_text())
    messages = trajectory_messages(row["trajectory"])
    steps = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    prompts = encode_step_prompts(tokenizer, messages, steps, thinking=False)
    for k in steps[:: max(1, len(steps) // 4)]:
        assert prompts[k] == encode_chat_prompt(tokenizer, messages[:k], thinking=False)


def test_recorded_action_scores_one_same_tool_half_other_zero(task):
    examples = task.train[:60]
    gold = task.score(examples, [completion(task.tokenizer, e.answer) for e in examples])
    assert gold.min() == 1.0
    reference = examples[0].answer
    tool = extract_command(reference).split()[0]
    other_args = f"Let me try.\n\n```\n{tool} some_other_argument\n```"
    other_tool = (
        "Let me look.\n\n```\nfind_file nothing_here.py\n```"
        if tool != "find_file"
        else "Let me look.\n\n```\nls -la\n```"
    )
    responses = [completion(task.tokenizer, t) for t in (other_args, other_tool, "no command")]
    assert task.score([examples[0]] * 3, responses).tolist() == [0.5, 0.0, 0.0]


def test_whitespace_variants_of_the_command_match(task):
    example = task.train[1]
    command = extract_command(example.answer)
    spaced = "Doing it.\n```bash\n  " + command.replace(" ", "   ") + "  \n\n```"
    assert task.score([example], [completion(task.tokenizer, spaced)]).tolist() == [1.0]


def test_ids_are_stable_and_truncation_keeps_every_step(sample_dir, task):
    truncated = build_task(
        dataset_option(
            "swe_agent",
            data_files=str(sample_dir / "*.json"),
            long_prompts=LongPrompts.truncate.value,
        )
    )
    assert len(truncated.train) == len(task.train) + task.long_prompts
    kept = {e.id: e for e in truncated.train}
    for e in task.train[::25]:
        np.testing.assert_array_equal(kept[e.id].prompt_tokens, e.prompt_tokens)
    assert max(len(e.prompt_tokens) for e in truncated.train) == 15360
