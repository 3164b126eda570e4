"""Schema of the `trainer` keys (root-level, no group): memory/speed knobs of the train step."""

import dataclasses

from locoexp.errors import require


@dataclasses.dataclass(kw_only=True)
class TrainerConfig:
    # The output head runs over the K loss positions in chunks of this many tokens, each
    # rematerialised in the backward pass, so [K, V] logits never exist at once
    # (at V = 151,936 a 512-token chunk is 311 MB in float32).
    logit_chunk_tokens: int = 512
    # Packed row length; None = dataset.max_prompt_tokens + dataset.max_new_tokens (rounded up to 8)
    row_tokens: int | None = None

    def __post_init__(self):
        require(self.logit_chunk_tokens >= 1,
                f"trainer.logit_chunk_tokens={self.logit_chunk_tokens} must be a positive integer.")
        require(self.row_tokens is None or self.row_tokens >= 2,
                f"trainer.row_tokens={self.row_tokens} must be >= 2 or null.")
