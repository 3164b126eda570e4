"""`TextTask`: the `Task` of every real workload: chat prompts in, responses graded as text.

Completions arrive as token ids (ending with EOS when one was emitted); they are decoded without
EOS and padding and graded against `Example.answer` by a `RewardScorer` (in process, or in a
process pool with `dataset.reward_workers > 0`).
"""

from collections.abc import Sequence

import numpy as np

from locoexp.dataset.config import LongPrompts
from locoexp.dataset.prompts import cap_prompt, encode_chat_prompt
from locoexp.dataset.task import Example
from locoexp.reward.scorer import RewardScorer
from locoexp.tokenizer import ChatTokenizer


class TextTask:
    def __init__(
        self,
        tokenizer: ChatTokenizer,
        *,
        train: Sequence[Example],
        eval: Sequence[Example],
        long_prompts: int,
        scorer: RewardScorer,
        thinking: bool,
        max_prompt_tokens: int,
        long_prompt_policy: LongPrompts,
    ):
        self.tokenizer = tokenizer
        self.thinking = thinking
        self.max_prompt_tokens = max_prompt_tokens
        self.long_prompt_policy = long_prompt_policy
        self.train = train
        self.eval = eval
        self.long_prompts = long_prompts  # over the cap in train + eval, dropped or truncated
        self.scorer = scorer

    def encode_prompt(self, example: Example) -> np.ndarray:
        """Render the example's conversation with the chat template, tokenize it and cap it: the
        per-request work of admission (Section 4.3). Examples kept at load are never dropped."""
        tokens = encode_chat_prompt(self.tokenizer, example.messages, thinking=self.thinking)
        capped = cap_prompt(tokens, self.max_prompt_tokens, self.long_prompt_policy)
        assert capped is not None, "a prompt kept at load fits its cap once truncated"
        return capped

    def response_text(self, completion: np.ndarray) -> str:
        ids = [int(i) for i in completion]
        if self.tokenizer.eos_id in ids:
            ids = ids[: ids.index(self.tokenizer.eos_id)]
        return self.tokenizer.decode([i for i in ids if i != self.tokenizer.pad_id])

    def score(self, examples: Sequence[Example], completions: Sequence[np.ndarray]) -> np.ndarray:
        """Rewards [N] float32 in [0, 1]."""
        texts = [self.response_text(c) for c in completions]
        return self.scorer([e.answer for e in examples], texts)

    def is_correct(self, rewards: np.ndarray) -> np.ndarray:
        return rewards >= 1.0
