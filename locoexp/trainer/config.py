"""Schema of the `trainer` keys (root-level, no group): memory/speed knobs of the train step."""

import dataclasses

from locoexp.errors import require


@dataclasses.dataclass(kw_only=True)
class TrainerConfig:
    # The output head and loss run over the K loss positions in chunks of this many tokens
    # (locoexp/trainer/head.py), so [K, V] logits never exist at once: at V = 151,936 a chunk's
    # logits are 156 MB in float32. W1 peak RSS: 2.85 GB at 256, 3.11 GB at 512.
    logit_chunk_tokens: int = 256
    # Packed row length; None = dataset.max_prompt_tokens + dataset.max_new_tokens (rounded up to 8)
    row_tokens: int | None = None

    def __post_init__(self):
        require(
            self.logit_chunk_tokens >= 1,
            f"trainer.logit_chunk_tokens={self.logit_chunk_tokens} must be a positive integer.",
        )
        require(
            self.row_tokens is None or self.row_tokens >= 2,
            f"trainer.row_tokens={self.row_tokens} must be >= 2 or null.",
        )
