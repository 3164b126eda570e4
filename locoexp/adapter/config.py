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
    # Projections that get an adapter, in every block that has them (`block_projections`):
    # null = every projection of the model LoRA adapts (the attention's four, and the dense
    # MLP's three where the model has one: not Qwen3-MoE's expert stacks); Tunix's recipe names
    # all seven. A named projection the model does not have is refused (`check_targets`).
    targets: list[Projection] | None = None
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
        # values only: `locoexp.applies` refuses these keys under adapter=none
        require(self.rank >= 1, f"adapter.rank={self.rank} must be a positive integer.")
        require(self.alpha > 0, f"adapter.alpha={self.alpha} must be > 0.")
        require(
            self.targets is None or 0 < len(set(self.targets)) == len(self.targets),
            f"adapter.targets={_names(self.targets or [])} must name each projection at most "
            f"once and at least one of {', '.join(p.value for p in Projection)} (or be null: "
            "every projection the model has).",
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
        """LoRA parameters over every block: rank x (D_in + D_out) per adapted projection; 0
        for none."""
        if not self.trains_adapters:
            return 0
        return sum(
            self.rank * sum(shape)
            for layer in range(model.num_layers)
            for shape in adapted_projections(self, model, layer).values()
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


def block_projections(model: ModelConfig, layer: int) -> dict[Projection, tuple[int, int]]:
    """(D_in, D_out) of every projection LoRA can adapt in block `layer` of `model`, per family:
    - the attention's q, k, v, o at the layer's own head width and KV heads (Gemma4's global
      layers have theirs), without v_proj on Gemma4's key-is-value global layers, which have
      none (PEFT adapts the modules that exist, so it skips them too);
    - the dense MLP's gate, up, down, except in Qwen3-MoE, whose gate/up/down are [E, ...]
      expert stacks, not projections (not adapted here); Gemma4-26B's dense GeLU MLP beside its
      routed experts is adapted, its experts are not."""
    d, f = model.hidden_dim, model.mlp_dim
    kv_heads, h = model.layer_kv_shape(layer)
    q, kv = model.num_heads * h, kv_heads * h
    shapes = {
        Projection.q_proj: (d, q),
        Projection.k_proj: (d, kv),
        Projection.v_proj: (d, kv),
        Projection.o_proj: (q, d),
    }
    if model.gemma4 and model.global_key_is_value and model.is_global_layer(layer):
        del shapes[Projection.v_proj]
    if model.gemma4 or not model.moe:
        shapes |= {
            Projection.gate_proj: (d, f),
            Projection.up_proj: (d, f),
            Projection.down_proj: (f, d),
        }
    return shapes


def adaptable_projections(model: ModelConfig) -> list[Projection]:
    """The projections LoRA can adapt in at least one block of `model`, in `Projection` order."""
    found = {p for layer in range(model.num_layers) for p in block_projections(model, layer)}
    return [p for p in Projection if p in found]


def adapted_targets(adapter: AdapterConfig, model: ModelConfig) -> list[Projection]:
    """`adapter.targets`, or every projection LoRA adapts in `model` when it is null."""
    return adaptable_projections(model) if adapter.targets is None else list(adapter.targets)


def adapted_projections(
    adapter: AdapterConfig, model: ModelConfig, layer: int
) -> dict[Projection, tuple[int, int]]:
    """(D_in, D_out) of the projections of block `layer` that get an adapter."""
    targets = set(adapted_targets(adapter, model))
    return {p: s for p, s in block_projections(model, layer).items() if p in targets}


def check_targets(adapter: AdapterConfig, model: ModelConfig) -> None:
    """Refuse a named target that no block of `model` has as a projection (Qwen3-MoE's expert
    stacks; v_proj where every layer shares keys and values)."""
    named = adapter.targets if adapter.trains_adapters and adapter.targets else []
    valid = adaptable_projections(model)
    missing = [t for t in named if t not in valid]
    why = " (its MLP is a mixture of experts, whose stacks LoRA here does not adapt)"
    require(
        not missing,
        f"adapter.targets names {', '.join(_names(missing))}, which model {model.name} has no "
        f"projection of{why if model.moe and not model.gemma4 else ''}; valid targets: "
        f"{', '.join(_names(valid))}, or null for all of them.",
    )


def _names(projections: list[Projection]) -> list[str]:
    return [p.value for p in projections]
