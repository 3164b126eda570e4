"""Gemma4's text decoder block (transformers' `Gemma4TextDecoderLayer`), dense and MoE.

What differs from the Qwen3 block (`transformer.py`), as the published configs define it:
- attention: q/k RMSNorm per head and a scale-free RMSNorm on values; scores are not divided
  by sqrt(head_dim) (HF scaling = 1.0). Local layers attend over a sliding window with
  `head_dim`, `num_kv_heads` and RoPE at `rope_theta`; global layers over the whole row with
  `global_head_dim`, `global_kv_heads` and "proportional" RoPE (only the first
  `global_rotary_fraction` of each head's frequency pairs rotate, at `global_rope_theta`), and
  with `global_key_is_value` their values are the key projection (no v_proj);
- sandwich norms: the attention and MLP outputs are RMS-normed before the residual add, and the
  block's output is multiplied by a learned `layer_scalar`;
- the MLP is GeLU-gated (tanh approximation), and in the MoE model (Gemma4-26B) a routed expert
  branch runs beside it on the same residual: the router RMS-normalises its input (no scale),
  multiplies it by a learned `scale` and 1/sqrt(D), takes softmax top-k probabilities,
  renormalises them and scales each by a learned `per_expert_scale`.
The embedding is multiplied by sqrt(D) and the logits are soft-capped (`Transformer`).

It owns the block's numerics only (it never samples or knows about meshes); the projections,
norms, RoPE and KV-cache attention are the shared layers (`layers.py`), and `transformer.py`
builds the model from this block.

Shapes: B rows, T tokens, D width, H heads, K KV heads, h head width, E experts, I expert width.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from locoexp.model.attention import attend, causal_segment_mask
from locoexp.model.config import ModelConfig
from locoexp.model.layers import RMSNorm, apply_rope, attend_cached, linear, masked_attention
from locoexp.model.moe import expert_outputs, route, router_stats

Array = jax.Array
_MASKED = -1e30


def rms_normalise(x: Array, eps: float) -> Array:
    """x / rms(x) in float32, cast back: Gemma4's norm without a scale (values, router input)."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def gelu_mlp(x: Array, gate, up, down) -> Array:
    """down(gelu_tanh(gate(x)) * up(x)) (HF hidden_activation gelu_pytorch_tanh)."""
    return down(jax.nn.gelu(gate(x), approximate=True) * up(x))


class Gemma4MLP(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.gate_proj = linear(config.hidden_dim, config.mlp_dim, config, rngs)
        self.up_proj = linear(config.hidden_dim, config.mlp_dim, config, rngs)
        self.down_proj = linear(config.mlp_dim, config.hidden_dim, config, rngs)

    def __call__(self, x: Array) -> Array:
        return gelu_mlp(x, self.gate_proj, self.up_proj, self.down_proj)


class Gemma4Experts(nnx.Module):
    """Router and E GeLU experts (HF `Gemma4TextRouter` + `Gemma4TextExperts`); gate and up
    are fused as in the checkpoint: gate_up_proj [E, D, 2I], down_proj [E, I, D]."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c = config
        dtype = jnp.dtype(c.param_dtype.value)
        init = nnx.initializers.normal(c.init_std)
        self.k, self.eps, self.width = c.experts_per_token, c.rms_norm_eps, c.expert_mlp_dim
        self.router = nnx.Param(init(rngs.params(), (c.hidden_dim, c.num_experts), dtype))
        self.router_scale = nnx.Param(jnp.ones((c.hidden_dim,), dtype))
        self.per_expert_scale = nnx.Param(jnp.ones((c.num_experts,), dtype))
        shape = (c.num_experts, c.hidden_dim, 2 * c.expert_mlp_dim)
        self.gate_up_proj = nnx.Param(init(rngs.params(), shape, dtype))
        shape = (c.num_experts, c.expert_mlp_dim, c.hidden_dim)
        self.down_proj = nnx.Param(init(rngs.params(), shape, dtype))

    def __call__(self, routed_from: Array, x: Array, real: Array | None):
        """Router input and expert input [..., D] -> output [..., D] and router statistics."""
        lead = x.shape[:-1]
        flat_in = routed_from.reshape(-1, routed_from.shape[-1])
        d = flat_in.shape[-1]
        scaled = rms_normalise(flat_in, self.eps) * self.router_scale[...] * (d**-0.5)
        probs, weights, experts = route(scaled @ self.router[...], self.k, normalize=True)
        weights = weights * self.per_expert_scale[...][experts].astype(jnp.float32)
        gate_up = self.gate_up_proj[...]
        out = expert_outputs(
            x.reshape(-1, d), experts, weights, gate_up[..., : self.width],
            gate_up[..., self.width :], self.down_proj[...],
            activation=lambda g: jax.nn.gelu(g, approximate=True),
        )  # fmt: skip
        return out.reshape(*lead, -1), router_stats(probs, experts, real)


class Gemma4Attention(nnx.Module):
    """One layer's attention: local (sliding window) or global, as `config.is_global_layer`."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs, *, is_global: bool):
        c = config
        kv_heads, h = (c.global_kv_heads, c.global_head_dim) if is_global else (
            c.num_kv_heads, c.head_dim
        )  # fmt: skip
        self.is_global, self.num_heads, self.kv_heads, self.head_dim = (
            is_global,
            c.num_heads,
            kv_heads,
            h,
        )
        self.window = 0 if is_global else c.sliding_window
        self.eps = c.rms_norm_eps
        dtype = jnp.dtype(c.param_dtype.value)
        self.q_proj = linear(c.hidden_dim, c.num_heads * h, c, rngs)
        self.k_proj = linear(c.hidden_dim, kv_heads * h, c, rngs)
        self.key_is_value = is_global and c.global_key_is_value
        if not self.key_is_value:
            self.v_proj = linear(c.hidden_dim, kv_heads * h, c, rngs)
        self.o_proj = linear(c.num_heads * h, c.hidden_dim, c, rngs)
        self.q_norm = RMSNorm(h, c.rms_norm_eps, dtype)
        self.k_norm = RMSNorm(h, c.rms_norm_eps, dtype)

    def __call__(
        self, x, positions, mask, inv_freq, cache=None, cache_index=None, *, segment_ids=None,
        attention=None,
    ):  # fmt: skip
        """As `transformer.Attention`; `inv_freq` is the (local, global) pair of frequencies."""
        b, t, _ = x.shape
        h, freq = self.head_dim, inv_freq[1 if self.is_global else 0]
        q = apply_rope(
            self.q_norm(self.q_proj(x).reshape(b, t, self.num_heads, h)), positions, freq
        )
        raw_k = self.k_proj(x).reshape(b, t, self.kv_heads, h)
        raw_v = raw_k if self.key_is_value else self.v_proj(x).reshape(b, t, self.kv_heads, h)
        k = apply_rope(self.k_norm(raw_k), positions, freq)
        v = rms_normalise(raw_v, self.eps)
        q = q * jnp.asarray(h**0.5, q.dtype)  # HF scaling = 1; the kernels divide by sqrt(h)
        if segment_ids is not None:
            spec = dataclasses.replace(attention, window=self.window)
            out = attend(spec, q, k, v, segment_ids).reshape(b, t, self.num_heads * h)
            return self.o_proj(out), None
        if cache is not None:
            out, cache = attend_cached(q, k, v, mask, cache, cache_index, self.window)
            return self.o_proj(out), cache
        if self.window:
            mask = mask & causal_segment_mask(jnp.ones((b, t), jnp.int32), self.window)
        return self.o_proj(masked_attention(q, k, v, mask)), cache


class Gemma4Block(nnx.Module):
    """Sandwich-normed attention and MLP (plus the routed experts in the MoE model), the
    output scaled by `layer_scalar`. Returns (x, cache) or, with experts, (x, cache, stats)."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs, *, is_global: bool):
        c = config
        dtype = jnp.dtype(c.param_dtype.value)

        def norm():
            return RMSNorm(c.hidden_dim, c.rms_norm_eps, dtype)

        self.input_norm, self.post_attn_norm = norm(), norm()
        self.attn = Gemma4Attention(c, rngs, is_global=is_global)
        self.pre_mlp_norm, self.post_mlp_norm = norm(), norm()
        self.mlp = Gemma4MLP(c, rngs)
        self.layer_scalar = nnx.Param(jnp.ones((1,), dtype))
        self.moe = c.moe
        if c.moe:
            self.experts = Gemma4Experts(c, rngs)
            self.post_mlp_norm_1, self.pre_experts_norm, self.post_experts_norm = (
                norm(), norm(), norm()
            )  # fmt: skip

    def __call__(self, x, positions, mask, inv_freq, cache=None, cache_index=None, **packed):
        attn_out, cache = self.attn(
            self.input_norm(x), positions, mask, inv_freq, cache, cache_index, **packed
        )
        x = x + self.post_attn_norm(attn_out)
        out = self.mlp(self.pre_mlp_norm(x))
        stats = None
        if self.moe:
            real = packed["segment_ids"] > 0 if packed else None
            routed, stats = self.experts(x, self.pre_experts_norm(x), real)
            out = self.post_mlp_norm_1(out) + self.post_experts_norm(routed)
        x = (x + self.post_mlp_norm(out)) * self.layer_scalar[...]
        return (x, cache) if stats is None else (x, cache, stats)
