"""The `Tokenizer` Protocol every task's tokenizer satisfies (text <-> token ids).

It lives here, below `dataset/`: tasks hold a tokenizer, tokenizers never know tasks.
"""

from collections.abc import Sequence
from typing import Protocol


class Tokenizer(Protocol):
    vocab_size: int  # ids are in [0, vocab_size)
    eos_id: int  # generation stops here (the engine's stop token)
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...
