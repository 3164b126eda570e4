"""Math workloads (GSM8K, NuminaMath-CoT, OpenMathInstruct-2): one problem, one gold answer.

Each row becomes one user turn, `dataset.prompt_template` with the problem in it, rendered with
the chat template in the configured thinking mode. `Example.id` is the row's index in its split
(stable across runs and placements, also when long prompts are dropped). Rows without a usable
gold answer are skipped.
"""

from collections.abc import Callable, Iterable, Mapping

import datasets

from locoexp.dataset.config import DatasetConfig
from locoexp.dataset.load import load_rows
from locoexp.dataset.prompts import cap_prompt, encode_chat_prompt
from locoexp.dataset.task import Example
from locoexp.dataset.text_task import TextTask
from locoexp.reward.scorer import RewardKind, RewardScorer
from locoexp.tokenizer import ChatTokenizer

Row = Mapping[str, object]


def build_math_task(
    config: DatasetConfig,
    tokenizer: ChatTokenizer,
    *,
    problem_column: str,
    gold: Callable[[Row], str | None],
) -> TextTask:
    """`gold(row)` gives the row's answer (None: unusable row)."""
    train, train_long = _examples(
        config, tokenizer, load_rows(config, held_out=False), problem_column, gold
    )
    held_out = load_rows(config, held_out=True)
    eval_, eval_long = _examples(config, tokenizer, held_out or [], problem_column, gold)
    scorer = RewardScorer(RewardKind.math, workers=config.reward_workers)
    return TextTask(
        tokenizer,
        train=train,
        eval=eval_,
        long_prompts=train_long + eval_long,
        scorer=scorer,
        thinking=config.thinking,
        max_prompt_tokens=config.max_prompt_tokens,
        long_prompt_policy=config.long_prompts,
    )


def _examples(
    config: DatasetConfig,
    tokenizer: ChatTokenizer,
    rows: datasets.Dataset | Iterable[Row],
    problem_column: str,
    gold: Callable[[Row], str | None],
) -> tuple[list[Example], int]:
    examples, long_prompts = [], 0
    for index, row in enumerate(rows):
        answer = gold(row)
        if answer is None:
            continue
        content = config.prompt_template.replace("{problem}", str(row[problem_column]))
        messages = ({"role": "user", "content": content},)
        tokens = encode_chat_prompt(tokenizer, messages, thinking=config.thinking)
        long_prompts += len(tokens) > config.max_prompt_tokens
        prompt = cap_prompt(tokens, config.max_prompt_tokens, config.long_prompts)
        if prompt is not None:
            examples.append(
                Example(id=index, prompt_tokens=prompt, answer=answer, messages=messages)
            )
    return examples, long_prompts
