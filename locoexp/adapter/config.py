"""Schema of the `adapter` config group: none (full fine-tuning) or LoRA.

LoRA (Hu et al., 2021) adds to a projection y = x W the low-rank term (alpha / rank) x A B, with
A [in, rank] and B [rank, out]; B starts at zero, so the adapted model starts as the base. The
scaling is PEFT's (`lora_alpha / r`), so an adapter trained here is the same function in `peft`.
"""

import dataclasses
import enum
import math

from locoexp.errors import require
from locoexp.model.config import ModelConfig


class AdapterKind(enum.Enum):
    none = "none"  # full fine-tuning: every parameter trains
    lora = "lora"  # base weights frozen; only the LoRA factors train


class Projection(enum.Enum):
    """The decoder's linear projections (Hugging Face names, as PEFT's `target_modules`)."""

    q_proj = "q_proj"
    k_proj = "k_proj"
    v_proj = "v_proj"
    o_proj = "o_proj"
    gate_proj = "gate_proj"
    up_proj = "up_proj"
    down_proj = "down_proj"


class SavedModule(enum.Enum):
    """Modules trained in full beside the adapters (PEFT's `modules_to_save`: Hugging Face
    module names, matched as PEFT matches them: every module whose name ends so)."""

    embed_tokens = "embed_tokens"  # the embedding, and the head when it is tied to it
    lm_head = "lm_head"  # an untied head
    norm = "norm"  # every RMSNorm (the final one, and every name ending in "norm")
    input_layernorm = "input_layernorm"
    post_attention_layernorm = "post_attention_layernorm"
    q_norm = "q_norm"  # Qwen3's per-head query / key norms
    k_norm = "k_norm"


# Where each projection lives in a decoder block (`locoexp.model.transformer.Block`).
PROJECTION_MODULE = {
    Projection.q_proj: "attn",
    Projection.k_proj: "attn",
    Projection.v_proj: "attn",
    Projection.o_proj: "attn",
    Projection.gate_proj: "mlp",
    Projection.up_proj: "mlp",
    Projection.down_proj: "mlp",
}


@dataclasses.dataclass(kw_only=True)
class AdapterConfig:
    kind: AdapterKind = AdapterKind.none
    rank: int = 64  # r of A [in, r] and B [r, out] (App. G's Tunix recipe: 64)
    alpha: float = 64.0  # the low-rank term is scaled by alpha / rank (PEFT's lora_alpha)
    # Projections of every block that get an adapter (Tunix's recipe: all seven).
    targets: list[Projection] = dataclasses.field(default_factory=lambda: list(Projection))
    # Dropout on the adapter's input (PEFT's lora_dropout). Only 0 is implemented: the train
    # step draws no dropout keys, and GRPO's importance ratio compares the trainer's log-probs
    # with the engine's, which dropout would make disagree (App. G's recipe uses none).
    dropout: float = 0.0
    # Initialisation of A (B starts at zero); independent of the model's seed.
    seed: int = 0
    # Modules trained in full beside the adapters (PEFT's `modules_to_save`): in the optimizer,
    # the KL reference and checkpoints, published and exported with the adapters. Empty in
    # Tunix's recipe. A tied head trains with `embed_tokens` (PEFT's ensure_weight_tying): with
    # it frozen at the tiny model's init_std 0.02 every logit is at most sqrt(D) |e_v| = 1.24
    # and LoRA alone cannot learn the embedded task (experiments/LOG.md, sessions 13-14).
    modules_to_save: list[SavedModule] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.kind is AdapterKind.none:
            return
        require(self.rank >= 1, f"adapter.rank={self.rank} must be a positive integer.")
        require(self.alpha > 0, f"adapter.alpha={self.alpha} must be > 0.")
        require(
            len(self.targets) > 0 and len(set(self.targets)) == len(self.targets),
            f"adapter.targets={[t.value for t in self.targets]} must name each projection at "
            f"most once and at least one of {', '.join(p.value for p in Projection)}.",
        )
        require(
            self.dropout == 0.0,
            f"adapter.dropout={self.dropout} is not supported: only 0.0 (the train step draws "
            "no dropout keys and GRPO's ratio needs the engine's and the trainer's log-probs "
            "to agree).",
        )
        require(
            len(set(self.modules_to_save)) == len(self.modules_to_save),
            f"adapter.modules_to_save={[m.value for m in self.modules_to_save]} must name each "
            "module at most once.",
        )

    @property
    def scale(self) -> float:
        """alpha / rank: the factor of the low-rank term."""
        return self.alpha / self.rank

    @property
    def trains_adapters(self) -> bool:
        return self.kind is AdapterKind.lora

    def count_parameters(self, model: ModelConfig) -> int:
        """What trains: the LoRA factors and the `modules_to_save`; 0 for none."""
        return self.count_factors(model) + self.count_saved(model)

    def count_factors(self, model: ModelConfig) -> int:
        """LoRA parameters over every block: rank x (D_in + D_out) per target; 0 for none."""
        if not self.trains_adapters:
            return 0
        return model.num_layers * sum(
            self.rank * sum(projection_shape(model, t)) for t in self.targets
        )

    def count_saved(self, model: ModelConfig) -> int:
        """Parameters of the `modules_to_save` (base weights that train in full); 0 for none."""
        if not self.trains_adapters:
            return 0
        return sum(math.prod(shape) for shape in saved_tensors(self, model).values())


def saved_tensors(adapter: AdapterConfig, model: ModelConfig) -> dict[tuple, tuple[int, ...]]:
    """Plain parameter path -> shape of every tensor of `adapter.modules_to_save`, matched as
    PEFT matches them (every module whose name ends with a saved name: `norm` is every norm);
    a name that matches nothing in `model` is refused."""
    # the checkpoint's names need jax; the config (and the jax-free RunSpec) must not
    from locoexp.model.checkpoint import hf_shapes, tensor_names  # noqa: PLC0415

    shapes = hf_shapes(model)
    found: dict[tuple, tuple[int, ...]] = {}
    for saved in adapter.modules_to_save:
        matched = {
            path: shapes[name]
            for name, (path, _) in tensor_names(model).items()
            if name.removesuffix(".weight").endswith(saved.value)
        }
        require(
            bool(matched),
            f"adapter.modules_to_save names {saved.value}, which model {model.name} does not "
            f"have{' (its head is tied: name embed_tokens)' if saved.value == 'lm_head' else ''}"
            "; remove it.",
        )
        found |= matched
    return found


def projection_shape(model: ModelConfig, projection: Projection) -> tuple[int, int]:
    """(D_in, D_out) of a block's projection."""
    d, f = model.hidden_dim, model.mlp_dim
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    match projection:
        case Projection.q_proj:
            return d, q
        case Projection.k_proj | Projection.v_proj:
            return d, kv
        case Projection.o_proj:
            return q, d
        case Projection.gate_proj | Projection.up_proj:
            return d, f
        case Projection.down_proj:
            return f, d
