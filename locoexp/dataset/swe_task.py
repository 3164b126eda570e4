"""SWE-agent trajectories (nebius/SWE-agent-trajectories): the prefill-heavy workload of Table 1.

A trajectory is a system prompt, the issue, then alternating agent actions (`ai`) and
environment observations (`user`). Every action step is one example: the prompt is the whole
trajectory before that action (system, issue, earlier actions and observations) rendered with
the chat template, and the response is the next action, a short discussion plus one command.
Prompts are long (thousands of tokens) and responses short, as in the paper (outputs of about
140 tokens). The reward compares the response's command with the recorded action's command
(locoexp/reward/swe.py); nothing is executed.

`Example.id` numbers (trajectory row, action step) pairs in split order, before long prompts
are dropped. The upstream dataset has only a train split; held-out examples come from
`dataset.eval_data_files` or a named hub split when one is configured.
"""

from collections.abc import Iterable, Mapping

import datasets

from locoexp.dataset.config import DatasetConfig
from locoexp.dataset.load import load_rows
from locoexp.dataset.prompts import cap_prompt, encode_step_prompts
from locoexp.dataset.task import Example
from locoexp.dataset.text_task import TextTask
from locoexp.errors import ConfigError
from locoexp.reward.scorer import RewardKind, RewardScorer
from locoexp.tokenizer import ChatTokenizer

_ROLES = {"system": "system", "user": "user", "ai": "assistant"}
_TEXT = datasets.Value("string")
# The schema of nebius/SWE-agent-trajectories (its dataset card); fixed rather than inferred.
FEATURES = datasets.Features(
    {
        "instance_id": _TEXT,
        "model_name": _TEXT,
        "target": datasets.Value("bool"),
        "trajectory": [
            {
                "cutoff_date": _TEXT,
                "mask": datasets.Value("bool"),
                "role": _TEXT,
                "system_prompt": _TEXT,
                "text": _TEXT,
            }
        ],
        "exit_status": _TEXT,
        "generated_patch": _TEXT,
        "eval_logs": _TEXT,
    }
)


def build_swe_task(config: DatasetConfig, tokenizer: ChatTokenizer) -> TextTask:
    train_rows = load_rows(config, held_out=False, features=FEATURES)
    if "trajectory" not in train_rows.column_names:
        raise ConfigError(
            f"dataset.kind=swe_agent needs a 'trajectory' column; the rows have "
            f"{train_rows.column_names}."
        )
    train, train_long = _examples(config, tokenizer, train_rows)
    eval_, eval_long = _examples(
        config, tokenizer, load_rows(config, held_out=True, features=FEATURES) or []
    )
    scorer = RewardScorer(RewardKind.swe_action, workers=config.reward_workers)
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


def trajectory_messages(trajectory: Iterable[Mapping[str, object]]) -> list[dict[str, str]]:
    """Chat turns of a trajectory; the system turn's text is in its `system_prompt` field."""
    messages = []
    for turn in trajectory:
        role = _ROLES[str(turn["role"])]
        text = turn["system_prompt"] if role == "system" else turn["text"]
        messages.append({"role": role, "content": str(text or "")})
    return messages


def _examples(config: DatasetConfig, tokenizer: ChatTokenizer, rows) -> tuple[list[Example], int]:
    examples, long_prompts, next_id = [], 0, 0
    for row in rows:
        messages = trajectory_messages(row["trajectory"])
        steps = [
            k for k, m in enumerate(messages) if m["role"] == "assistant" and k > 0 and m["content"]
        ]
        prompts = encode_step_prompts(tokenizer, messages, steps, thinking=config.thinking)
        for k in steps:
            long_prompts += len(prompts[k]) > config.max_prompt_tokens
            prompt = cap_prompt(prompts[k], config.max_prompt_tokens, config.long_prompts)
            if prompt is not None:
                examples.append(
                    Example(
                        id=next_id,
                        prompt_tokens=prompt,
                        answer=messages[k]["content"],
                        messages=tuple(messages[:k]),
                    )
                )
            next_id += 1
    return examples, long_prompts
