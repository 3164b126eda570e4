"""Schema of the `model` config group: architecture, init and dtypes of the decoder.

One dataclass describes every model of the paper (Qwen3 0.6B-32B, Llama-3.1 70B/405B and the
synthetic ~100B/~200B widths) and the tiny CPU models; Llama-3.1 is the same block without the
per-head q/k RMSNorm (`qk_norm: false`). With `num_experts > 0` every block's MLP is Qwen3-MoE's
sparse block (`locoexp/model/moe.py`): a softmax top-k router over `num_experts` SwiGLU experts
of width `expert_mlp_dim` (Qwen3-30B-A3B, App. G's third recipe). `family: gemma4` selects
Gemma4's block (`locoexp/model/gemma4.py`): sliding-window local layers with a full-attention
global layer every `global_attention_every`, its own head width, KV heads and proportional RoPE,
sandwich norms, a GeLU MLP (beside a routed expert branch when `num_experts > 0`, Gemma4-26B)
and soft-capped logits (App. G's MaxText recipe).
"""

import dataclasses
import enum

from locoexp.errors import require


class Family(enum.Enum):
    """The block's family. qwen3: Qwen3, Llama-3.1 (`qk_norm: false`) and Qwen3-MoE
    (`num_experts > 0`); gemma4: Gemma4's text decoder, dense or mixture of experts."""

    qwen3 = "qwen3"
    gemma4 = "gemma4"


class DType(enum.Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"


@dataclasses.dataclass(kw_only=True)
class ModelConfig:
    """Decoder architecture. Shapes: V vocabulary, D width, F MLP width."""

    name: str = "tiny"
    family: Family = Family.qwen3
    vocab_size: int = 16  # V
    num_layers: int = 2
    hidden_dim: int = 64  # D
    mlp_dim: int = 192  # F
    num_heads: int = 4  # query heads
    num_kv_heads: int = 2  # grouped-query attention: num_heads % num_kv_heads == 0
    head_dim: int = 16  # may differ from hidden_dim // num_heads (Qwen3 does)
    rope_theta: float = 10_000.0
    # Llama-3.1 "llama3" RoPE frequency scaling; factor 1.0 means no scaling.
    rope_scaling_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192
    rms_norm_eps: float = 1e-6
    qk_norm: bool = True  # Qwen3: RMSNorm on each query/key head; Llama-3.1: false
    tie_embeddings: bool = True
    param_dtype: DType = DType.float32
    # The trainer's activations and matmuls (MaxText's `dtype` beside its `weight_dtype`): null =
    # param_dtype. MaxText keeps bfloat16 activations over float32 weights; the paper's
    # single-controller arm trains so on NuminaMath and SWE (Sec. 6.1, Table E1). Dense
    # qwen3-family blocks only; the engines compute in their own weights' dtype.
    compute_dtype: DType | None = None
    init_std: float = 0.02
    # Mixture of experts (Qwen3-MoE's `Qwen3MoeSparseMoeBlock`); 0 experts = the dense MLP.
    num_experts: int = 0  # E
    experts_per_token: int = 0  # top-k experts each token is routed to
    expert_mlp_dim: int = 0  # each expert's SwiGLU width (HF moe_intermediate_size)
    normalize_top_k: bool = True  # HF norm_topk_prob: the k routing weights sum to 1
    # Switch-Transformer load-balancing loss added to the GRPO loss with this weight (HF
    # router_aux_loss_coef; Qwen3-30B-A3B publishes 0.001); 0 leaves routing unregularised.
    router_aux_loss_coef: float = 0.0
    # Gemma4 only (family: gemma4). Local layers attend over the last `sliding_window` tokens
    # with `head_dim`, `num_kv_heads` and RoPE at `rope_theta`; every `global_attention_every`-th
    # layer (and the last) attends over the whole row with `global_head_dim`, `global_kv_heads`,
    # RoPE at `global_rope_theta` on the first `global_rotary_fraction` of each head ("proportional"
    # RoPE), and, with `global_key_is_value`, values that are the keys' projection (HF
    # attention_k_eq_v).
    sliding_window: int = 0
    global_attention_every: int = 6
    global_head_dim: int = 0
    global_kv_heads: int = 0
    global_rope_theta: float = 1_000_000.0
    global_rotary_fraction: float = 1.0
    global_key_is_value: bool = False
    # Logits soft-capped as cap * tanh(logits / cap), 0 = none (Gemma4 publishes one; the head
    # applies it under every family).
    final_logit_softcap: float = 0.0
    # A local Hugging Face checkpoint directory (config.json + safetensors); None = random init.
    checkpoint: str | None = None

    def __post_init__(self):
        for key in (
            "vocab_size",
            "num_layers",
            "hidden_dim",
            "mlp_dim",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            value = getattr(self, key)
            require(value >= 1, f"model.{key}={value} is invalid: it must be a positive integer.")
        require(
            self.num_heads % self.num_kv_heads == 0,
            f"model.num_kv_heads={self.num_kv_heads} must divide model.num_heads="
            f"{self.num_heads} (grouped-query attention).",
        )
        require(self.rope_theta > 0, f"model.rope_theta={self.rope_theta} must be > 0.")
        require(self.rms_norm_eps > 0, f"model.rms_norm_eps={self.rms_norm_eps} must be > 0.")
        self._check_experts()
        self._check_gemma4()
        require(
            self.final_logit_softcap >= 0,
            f"model.final_logit_softcap={self.final_logit_softcap} must be >= 0 (0 = none).",
        )
        require(
            self.rope_scaling_factor >= 1.0,
            f"model.rope_scaling_factor={self.rope_scaling_factor} must be >= 1 (1 = no scaling).",
        )

    @property
    def activation_dtype(self) -> DType:
        """The dtype activations and matmuls run in: `compute_dtype`, else `param_dtype`."""
        return self.compute_dtype or self.param_dtype

    @property
    def moe(self) -> bool:
        """Whether the blocks' MLP is the sparse mixture of experts."""
        return self.num_experts > 0

    @property
    def gemma4(self) -> bool:
        return self.family is Family.gemma4

    def is_global_layer(self, layer: int) -> bool:
        """Gemma4: whether `layer` attends over the whole row (HF layer_types "full_attention"):
        every `global_attention_every`-th layer and the last; every layer of other families."""
        if not self.gemma4:
            return True
        return (layer + 1) % self.global_attention_every == 0 or layer == self.num_layers - 1

    def layer_kv_shape(self, layer: int) -> tuple[int, int]:
        """(KV heads, head width) of `layer`: Gemma4's global layers have their own."""
        if self.gemma4 and self.is_global_layer(layer):
            return self.global_kv_heads, self.global_head_dim
        return self.num_kv_heads, self.head_dim

    def _check_gemma4(self) -> None:
        """Gemma4's attention keys' values (`locoexp.applies` refuses them on other families,
        whose defaults Gemma4 could not run: a window of 0 tokens)."""
        if not self.gemma4:
            return
        for key in ("sliding_window", "global_attention_every", "global_head_dim"):
            value = getattr(self, key)
            require(
                value >= 1,
                f"model.{key}={value} must be a positive integer for Gemma4 (model.family=gemma4).",
            )
        require(
            self.global_kv_heads >= 1 and self.num_heads % self.global_kv_heads == 0,
            f"model.global_kv_heads={self.global_kv_heads} must divide model.num_heads="
            f"{self.num_heads} (grouped-query attention of Gemma4's global layers).",
        )
        require(
            0 < self.global_rotary_fraction <= 1,
            f"model.global_rotary_fraction={self.global_rotary_fraction} must be in (0, 1].",
        )

    def _check_experts(self) -> None:
        require(
            self.num_experts >= 0, f"model.num_experts={self.num_experts} must be >= 0 (0 = dense)."
        )
        require(
            self.router_aux_loss_coef >= 0,
            f"model.router_aux_loss_coef={self.router_aux_loss_coef} must be >= 0.",
        )
        if not self.moe:  # the experts' keys are refused on a dense model (`locoexp.applies`)
            return
        require(
            1 <= self.experts_per_token <= self.num_experts,
            f"model.experts_per_token={self.experts_per_token} must be in [1, model.num_experts="
            f"{self.num_experts}] for a mixture-of-experts model.",
        )
        require(
            self.expert_mlp_dim >= 1,
            f"model.expert_mlp_dim={self.expert_mlp_dim} must be a positive integer for a "
            "mixture-of-experts model.",
        )


class AttentionKind(enum.Enum):
    """How the train step attends over packed rows (`trainer.attention`; kernels in
    `locoexp/model/attention.py`). Only `dense` forms [L, L] scores; the others grow linearly
    with the row length L in memory, forward and backward.

    dense: [B, heads, L, L] scores and a [B, L, L] mask (the reference in tests).
    blockwise: online softmax over key/query blocks in plain JAX with a recomputing backward
    (flash-attention style); every backend.
    splash: JAX's Pallas splash-attention kernel; TPU only.
    cudnn: `jax.nn.dot_product_attention(implementation="cudnn")`; GPU only.
    """

    dense = "dense"
    blockwise = "blockwise"
    splash = "splash"
    cudnn = "cudnn"


# `trainer.attention_block_tokens`' default (its measurements are in trainer/config.py); also the
# default of the kernel's own `AttentionSpec`.
ATTENTION_BLOCK_TOKENS = 384


def attention_block(row_tokens: int, block_tokens: int) -> int:
    """The block size `blockwise` attention uses on rows of `row_tokens`: the fewest blocks of
    at most `block_tokens` (`trainer.attention_block_tokens`), made equal and rounded up to a
    multiple of 8. At 256, rows of 264 tokens take 2 blocks of 136 rather than 256 + a block of
    8 padded to 256, which doubled every block-pair matmul of the second block (a 1-layer GSM8K
    train step at caps 256 + 2: 2.91 -> 1.76 s on CPU; experiments/LOG.md, session 9). Rows
    that are a multiple of `block_tokens` keep it (2,560 at 256: 10 x 256; at 384: 7 x 368)."""
    blocks = -(-row_tokens // block_tokens)
    size = -(-row_tokens // blocks)
    return -(-size // 8) * 8


class RematPolicy(enum.Enum):
    """What each decoder block keeps for the backward pass (`trainer.remat`).

    none: every activation (the fastest, the most memory).
    block: only the block's input; the block is recomputed in the backward pass.
    save_matmuls: the outputs of the weight matmuls (projections, MLP); the rest is recomputed.
    offload: like save_matmuls, but saved in host memory (the paper's 405B workaround, Table
    H2); TPU/GPU only.
    """

    none = "none"
    block = "block"
    save_matmuls = "save_matmuls"
    offload = "offload"
