"""LoRA around the decoder's projections, with flax's `nnx.LoRA` (no hand-written layer).

`adapt_model` returns a copy of a plain `Transformer` whose targeted projections are wrapped:
`nnx.LoRA(base_module=<the projection>)` owns A [in, r] and B [r, out] as `nnx.LoRAParam`, so
`nnx.split(model, trained_filter(...), nnx.Param)` separates what trains (the factors, and
the base weights PEFT's `modules_to_save` names, trained in full) from the frozen base.
`merge_adapters` folds them back into the plain model's parameters, W + (alpha / r) A B, which
is what the engines load and what the Hugging Face export writes. It must not train, sample or
know about meshes; the transformer module itself is left as it is.

Shapes: r rank, D_in / D_out the projection's input / output width.
"""

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from locoexp.adapter.config import (
    PROJECTION_MODULE,
    AdapterConfig,
    adapted_projections,
    saved_tensors,
)
from locoexp.model.config import ModelConfig
from locoexp.model.transformer import Transformer

# The adapted projection's keys in `nnx.to_pure_dict` (attribute names of `nnx.LoRA`).
BASE, LORA_A, LORA_B = "base_module", "lora_a", "lora_b"


def trained_filter(adapter: AdapterConfig, model: ModelConfig) -> nnx.filterlib.Filter:
    """What trains under LoRA: the factors, and the base weights of `adapter.modules_to_save`
    (by their plain paths, which adapting leaves unchanged)."""
    saved = set(saved_tensors(adapter, model))
    if not saved:
        return nnx.LoRAParam
    return nnx.Any(nnx.LoRAParam, nnx.All(nnx.Param, lambda path, _: tuple(path) in saved))


def saved_weights(pure: dict, adapter: AdapterConfig, model: ModelConfig) -> dict[tuple, Any]:
    """The trained `modules_to_save` weights in the pure dict of the trained state, by plain
    path (e.g. ("embed", "embedding")); leaves as the dict holds them (jax or numpy arrays)."""
    found = {}
    for path in saved_tensors(adapter, model):
        node = pure
        for key in path:
            node = node[key]
        found[path] = node
    return found


class ScaledLoRA(nnx.LoRA):
    """`nnx.LoRA` around a base projection with PEFT's scaling: y = base(x) + s x A B, s = alpha
    / r. Like the base `Linear`, the low-rank term runs as 2-D matmuls over every leading
    position (one plain weight-gradient matmul per factor)."""

    def __init__(self, base: nnx.Linear, *, rank: int, scale: float, rngs: nnx.Rngs):
        super().__init__(
            base.in_features,
            rank,
            base.out_features,
            base_module=base,
            dtype=base.dtype,
            param_dtype=base.param_dtype,
            rngs=rngs,
        )
        self.scale = scale

    # flax's LoRA takes **kwargs for its base module; this one calls a plain projection
    def __call__(self, x: jax.Array) -> jax.Array:  # type: ignore[override]
        assert self.base_module is not None, "built around `base` (__init__)"
        out = self.base_module(x)
        flat = x.reshape(-1, x.shape[-1]).astype(self.lora_a.dtype)
        low = (flat @ self.lora_a[...]) @ self.lora_b[...]
        return out + (low * self.scale).reshape(out.shape).astype(out.dtype)


def adapt_model(model: Transformer, adapter: AdapterConfig) -> Transformer:
    """A copy of `model` (sharing its arrays) with the targeted projections of every block that
    has them (`adapted_projections`) wrapped in a `ScaledLoRA`; A drawn from `adapter.seed`
    (nnx's He-uniform), B zero. `model` is unchanged."""
    adapted = nnx.merge(*nnx.split(model))
    rngs = nnx.Rngs(params=adapter.seed)
    for layer, block in enumerate(adapted.layers):
        for target in adapted_projections(adapter, model.config, layer):
            owner = getattr(block, PROJECTION_MODULE[target])
            base = getattr(owner, target.value)
            wrapped = ScaledLoRA(base, rank=adapter.rank, scale=adapter.scale, rngs=rngs)
            setattr(owner, target.value, wrapped)
    return adapted


def merge_adapters(pure: dict, *, scale: float) -> dict:
    """The adapted model's `nnx.to_pure_dict` -> the plain model's: every wrapped projection's
    kernel becomes W + scale A B (summed in float32, stored in W's dtype)."""
    if not isinstance(pure, dict):
        return pure
    if BASE in pure:
        kernel = pure[BASE]["kernel"]
        delta = jnp.matmul(pure[LORA_A], pure[LORA_B], preferred_element_type=jnp.float32)
        return {"kernel": (kernel.astype(jnp.float32) + scale * delta).astype(kernel.dtype)}
    return {key: merge_adapters(value, scale=scale) for key, value in pure.items()}


def lora_factors(pure: dict, prefix: tuple = ()) -> dict[tuple, tuple[Any, Any]]:
    """Every adapted projection's path in the plain model (e.g. ("layers", 0, "attn", "q_proj",
    "kernel")) -> its (A [D_in, r], B [r, D_out]), from the pure dict of the adapted model or
    of its `nnx.LoRAParam` state alone; leaves as the dict holds them (jax or numpy arrays)."""
    if not isinstance(pure, dict):
        return {}
    if LORA_A in pure:
        return {(*prefix, "kernel"): (pure[LORA_A], pure[LORA_B])}
    found: dict[tuple, tuple[Any, Any]] = {}
    for key, value in pure.items():
        found |= lora_factors(value, (*prefix, key))
    return found


def load_factors(adapted: Transformer, factors: dict[tuple, tuple]) -> None:
    """Set the adapted model's (A, B) from `factors` keyed like `lora_factors` (e.g. read from
    a PEFT directory by `locoexp.adapter.peft.read_peft_adapter`)."""
    state = nnx.state(adapted, nnx.LoRAParam)
    pure = nnx.to_pure_dict(state)
    for path, (a, b) in factors.items():
        node = pure
        for key in path[:-1]:
            node = node[key]
        node[LORA_A], node[LORA_B] = jnp.asarray(a), jnp.asarray(b)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(adapted, state)


def load_saved(adapted: Transformer, saved: dict[tuple, object]) -> None:
    """Set the adapted model's `modules_to_save` weights from `saved` keyed by plain path (e.g.
    read from a PEFT directory by `locoexp.adapter.peft.read_saved_modules`)."""
    state = nnx.state(adapted, nnx.Param)
    pure = nnx.to_pure_dict(state)
    for path, weight in saved.items():
        node = pure
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = jnp.asarray(weight)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(adapted, state)
