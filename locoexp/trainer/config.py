"""Schema of the `trainer` keys (root-level, no group): memory/speed knobs of the train step."""

import dataclasses
import enum

from locoexp.errors import require


class AttentionKind(enum.Enum):
    dense = "dense"  # materialises [rows, heads, L, L] scores: the reference in tests
    blockwise = "blockwise"  # online softmax over key blocks, plain JAX, every backend
    splash = "splash"  # the Pallas splash-attention kernel (TPU; interpret mode on CPU)
    cudnn = "cudnn"  # jax.nn.dot_product_attention(implementation="cudnn") (GPU)


class RematPolicy(enum.Enum):
    none = "none"  # keep every activation the backward pass needs
    block = "block"  # keep each decoder block's input only; recompute the block in backward
    save_matmuls = "save_matmuls"  # keep the matmul outputs, recompute the rest
    offload = "offload"  # block, with the saved block inputs in host memory (TPU, Table H2)


@dataclasses.dataclass(kw_only=True)
class TrainerConfig:
    # The output head and loss run over the K loss positions in chunks of this many tokens
    # (locoexp/trainer/head.py), so [K, V] logits never exist at once: at V = 151,936 a chunk's
    # logits are 156 MB in float32. W1 peak RSS: 2.85 GB at 256, 3.11 GB at 512.
    logit_chunk_tokens: int = 256
    # Packed row length; None = dataset.max_prompt_tokens + dataset.max_new_tokens (rounded up to 8)
    row_tokens: int | None = None
    # Attention of the train step; every kind but dense has no [L, L] scores in forward or backward.
    attention: AttentionKind = AttentionKind.blockwise
    attention_block_tokens: int = 512  # key/query block of blockwise attention
    remat: RematPolicy = RematPolicy.none  # rematerialisation per decoder block
    # Packed rows per device per micro-batch (gradient accumulation, one optimizer update per
    # batch). 0 = the most that fit: the memory plan (locoexp/planner) resolves it at start-up.
    micro_batch_rows: int = 0

    def __post_init__(self):
        require(
            self.logit_chunk_tokens >= 1,
            f"trainer.logit_chunk_tokens={self.logit_chunk_tokens} must be a positive integer.",
        )
        require(
            self.row_tokens is None or self.row_tokens >= 2,
            f"trainer.row_tokens={self.row_tokens} must be >= 2 or null.",
        )
        require(
            self.attention_block_tokens >= 1,
            f"trainer.attention_block_tokens={self.attention_block_tokens} must be >= 1.",
        )
        require(
            self.micro_batch_rows >= 0,
            f"trainer.micro_batch_rows={self.micro_batch_rows} must be >= 0 (0 = the most that "
            "fit).",
        )
