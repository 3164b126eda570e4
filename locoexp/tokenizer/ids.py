"""Token ids written as text: the tokenizer of workload W1's random-id prompts.

W1's prompts are random token ids over the model's vocabulary (locoexp/dataset/random_tokens.py),
never rendered from words; their text is the ids in decimal, space-separated, so a prompt or a
completion can be printed and read back. `locoexp.tokenizer.files` writes it as a word-level
Hugging Face tokenizer over the same ids.
"""

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class IdTokenizer:
    """`encode("17 4")` = [17, 4]; every id of [0, vocab_size) is a word of its own."""

    vocab_size: int
    eos_id: int = 1
    pad_id: int = 0

    def encode(self, text: str) -> list[int]:
        return [int(word) for word in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(i)) for i in ids)
