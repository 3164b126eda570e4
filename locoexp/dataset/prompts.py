"""Chat-rendered prompt tokens and the prompt cap.

A prompt is the model family's chat template over the conversation plus the generation prompt
(`<|im_start|>assistant\\n`, and with thinking off Qwen3's empty `<think>` block). The paper does
not say how prompts over the cap are handled; the real workloads drop them (conf/dataset/*.yaml:
a truncated math problem or a trajectory without its issue text is another task), and
`long_prompts=truncate` keeps the last `max_prompt_tokens` tokens instead. Either way they are
counted in `Task.long_prompts`.

SWE-agent trajectories give one prompt per step, each a prefix of the next. Rendering and
tokenizing every prefix afresh is quadratic in trajectory length, so each turn is tokenized once
and prefix tokens are reused. That is exact because every turn starts with the `<|im_start|>`
control token, at which tokenization always splits.
"""

from collections.abc import Mapping, Sequence

import numpy as np

from locoexp.dataset.config import LongPrompts
from locoexp.tokenizer import ChatTokenizer

Messages = Sequence[Mapping[str, str]]
_TURN_START = "<|im_start|>"


def encode_chat_prompt(
    tokenizer: ChatTokenizer, messages: Messages, *, thinking: bool
) -> list[int]:
    text = tokenizer.render_chat(messages, add_generation_prompt=True, thinking=thinking)
    return tokenizer.encode(text)


def encode_step_prompts(
    tokenizer: ChatTokenizer, messages: Messages, steps: Sequence[int], *, thinking: bool
) -> dict[int, list[int]]:
    """Prompt tokens for each k in `steps`: the conversation `messages[:k]` + generation prompt.

    The whole conversation is rendered once and cut into its turns at `<|im_start|>`; a prompt
    is the first k turns plus the generation prompt. The cut is checked against a direct
    rendering of the longest prompt, and any template it does not fit is rendered per prompt.
    """
    if not steps:
        return {}
    last = max(steps)
    direct = tokenizer.render_chat(messages[:last], add_generation_prompt=True, thinking=thinking)
    whole = tokenizer.render_chat(messages, add_generation_prompt=False, thinking=thinking)
    turns = whole.split(_TURN_START)
    head = _TURN_START + _TURN_START.join(turns[1 : last + 1])
    if turns[0] or len(turns) != len(messages) + 1 or not direct.startswith(head):
        return {k: encode_chat_prompt(tokenizer, messages[:k], thinking=thinking) for k in steps}
    generation = tokenizer.encode(direct[len(head) :])
    wanted, prompts = set(steps), {}
    ids: list[int] = []
    for k in range(last + 1):
        if k in wanted:
            prompts[k] = ids + generation
        if k < last:
            ids = ids + tokenizer.encode(_TURN_START + turns[k + 1])
    return prompts


def cap_prompt(tokens: Sequence[int], cap: int, policy: LongPrompts) -> np.ndarray | None:
    """[P] int32 with P <= cap, or None when the prompt is dropped."""
    if len(tokens) <= cap:
        return np.asarray(tokens, np.int32)
    match policy:
        case LongPrompts.drop:
            return None
        case LongPrompts.truncate:
            return np.asarray(tokens[-cap:], np.int32)
