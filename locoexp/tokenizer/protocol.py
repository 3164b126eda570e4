"""The `Tokenizer` Protocol every task's tokenizer satisfies (text <-> token ids).

It lives here, below `dataset/`: tasks hold a tokenizer, tokenizers never know tasks.
"""

from collections.abc import Sequence
from typing import Protocol


class Tokenizer(Protocol):
    # Read-only members (properties): a frozen tokenizer, or one that derives its vocabulary size.
    @property
    def vocab_size(self) -> int:
        """Ids are in [0, vocab_size)."""
        ...

    @property
    def eos_id(self) -> int:
        """Generation stops here (the engine's stop token)."""
        ...

    @property
    def pad_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...
