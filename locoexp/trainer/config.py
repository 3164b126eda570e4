"""Schema of the `trainer` keys (root-level, no group): memory/speed knobs of the train step.

Also the start-up checks of the kernels a backend can run (`check_attention_backend`,
`check_remat_backend`), jax-free so that the root config's checks can call them.
"""

import dataclasses

from locoexp.errors import require
from locoexp.model.config import ATTENTION_BLOCK_TOKENS, AttentionKind, RematPolicy

__all__ = ["AttentionKind", "RematPolicy", "TrainerConfig", "check_attention_backend"]

# The platforms each kernel runs on (`jax.default_backend()` names).
_ATTENTION_PLATFORMS = {
    AttentionKind.dense: ("cpu", "gpu", "tpu"),
    AttentionKind.blockwise: ("cpu", "gpu", "tpu"),
    AttentionKind.splash: ("tpu",),
    AttentionKind.cudnn: ("gpu",),
}
_REMAT_PLATFORMS = {
    RematPolicy.none: ("cpu", "gpu", "tpu"),
    RematPolicy.block: ("cpu", "gpu", "tpu"),
    RematPolicy.save_matmuls: ("cpu", "gpu", "tpu"),
    RematPolicy.offload: ("gpu", "tpu"),  # needs a pinned host memory space next to the device
}


@dataclasses.dataclass(kw_only=True)
class TrainerConfig:
    # The output head and loss run over the K loss positions in chunks of this many tokens
    # (locoexp/trainer/head.py), so [K, V] logits never exist at once: at V = 151,936 a chunk's
    # logits are 311 MB in float32 at 512 tokens. Larger chunks give the head's weight-gradient
    # matmul a longer contraction but hold a larger [C, V] buffer while the body's activations
    # are alive. On CPU (experiments/LOG.md, session 6), interleaved: at Table 1 caps 512 took
    # 2% longer than 1,024 (40.4 against 39.5 s); W1's train phase took 8.8-9.1 s at 512 against
    # 9.0-9.3 s at 1,024, and its peak RSS 2.95-2.99 GB against 3.24-3.27 (W1's target: 3 GB).
    logit_chunk_tokens: int = 512
    # Packed row length; None = dataset.max_prompt_tokens + dataset.max_new_tokens (rounded up to 8)
    row_tokens: int | None = None
    # Attention kernel of the train step (see `AttentionKind`): blockwise runs everywhere and
    # never forms [L, L] scores; splash needs a TPU, cudnn a GPU.
    attention: AttentionKind = AttentionKind.blockwise
    # The most query/key tokens per block of `blockwise`: a row is cut into the fewest equal
    # blocks of at most this many (`model.config.attention_block`; a shorter row is one block).
    # Smaller blocks waste less of each diagonal block's masked half and of the last block's
    # padding, against more, smaller block-pair matmuls. At Table 1's caps on CPU (rows of
    # 2,560 holding 2,133 real tokens, micro-batches of 2 rows), with equal blocks: the whole
    # train step, interleaved, 33.54 s median at 384 (blocks of 368) against 35.11 s at 256;
    # attention alone faster at 384 in 7 of 8 row shapes, even at 1,024 tokens (experiments/
    # LOG.md, sessions 8 and 9). Rows of up to 384 tokens (W1's 128) are one block either way.
    attention_block_tokens: int = ATTENTION_BLOCK_TOKENS
    # What each decoder block keeps for the backward pass (see `RematPolicy`).
    remat: RematPolicy = RematPolicy.none
    # Packed rows per device per micro-batch; gradients are accumulated over the micro-batches
    # and the batch still gets one optimizer update (the paper's one update per batch).
    # 0 = the most that fit: the memory plan (locoexp/planner) resolves it at start-up, on a
    # shared CPU machine within 1 GiB of activations per micro-batch (planner/fit.py); a
    # Trainer built directly with 0 runs all rows at once.
    micro_batch_rows: int = 0
    # Gradient accumulation over micro-batches (locoexp's default). false is the paper's trainer
    # layout: one forward/backward pass and one optimizer update over the whole per-device batch
    # (Section 4.2: "our trainer does not accumulate gradients", so the whole packed batch must
    # fit at once; Table 3: SWE at 8 chips does not fit). The plan then sizes one micro-batch of
    # every row, and the dry run of a default run says when a cell fits only by accumulating.
    accumulate: bool = True
    # Expert parallelism of a mixture-of-experts model: the trainer's devices form an (fsdp,
    # expert) mesh with EP devices along `expert`; the [E, ...] expert weights and their AdamW
    # state are split E/EP along it (and FSDP along their largest other dimension), every other
    # parameter FSDP over all devices, rows over all devices; each MoE layer gathers its expert
    # group's tokens, computes its own experts' share and sums the shares with one all-reduce
    # (locoexp/model/moe.py). It must divide model.num_experts and the trainer's devices.
    # 1 = FSDP alone (the experts are gathered whole for their layer, as every weight is).
    expert_parallel: int = 1

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
            self.attention_block_tokens >= 8 and self.attention_block_tokens % 8 == 0,
            f"trainer.attention_block_tokens={self.attention_block_tokens} must be a positive "
            "multiple of 8.",
        )
        require(
            self.micro_batch_rows >= 0,
            f"trainer.micro_batch_rows={self.micro_batch_rows} must be >= 0 "
            "(0 = the most that fit).",
        )
        require(
            self.expert_parallel >= 1,
            f"trainer.expert_parallel={self.expert_parallel} must be a positive integer.",
        )


def check_attention_backend(kind: AttentionKind, platform: str) -> None:
    """Refuse (ConfigError) an attention kernel that `platform` ("cpu", "gpu", "tpu") cannot run."""
    allowed = _ATTENTION_PLATFORMS[kind]
    require(
        platform in allowed,
        f"trainer.attention={kind.value} runs only on {'/'.join(allowed)}, not on {platform}; "
        "use trainer.attention=blockwise (every backend).",
    )


def check_remat_backend(policy: RematPolicy, platform: str) -> None:
    """Refuse (ConfigError) a remat policy that `platform` ("cpu", "gpu", "tpu") cannot run."""
    allowed = _REMAT_PLATFORMS[policy]
    require(
        platform in allowed,
        f"trainer.remat={policy.value} runs only on {'/'.join(allowed)}, not on {platform}; "
        "use trainer.remat=save_matmuls or block to save memory here.",
    )
