"""The layers the decoder families share: projections, RMSNorm, RoPE and attention over a mask
or a KV cache. `transformer.py` (Qwen3, Llama-3.1, Qwen3-MoE) and `gemma4.py` build their blocks
from them; this module imports neither, so the two families' modules never import each other
both ways.

Shapes: B rows, T query tokens, S key slots (cache length), K KV heads, R = heads / K (query
heads per KV head), h head_dim, E cache heads (K, or more when a tensor-parallel engine repeats
KV heads).
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from locoexp.model.config import ModelConfig
from locoexp.model.paged import PagedLayer, attend_paged

Array = jax.Array

_MASKED = -1e30  # finite so that fully masked (padding) rows give uniform, not NaN, weights


def param_dtype(config: ModelConfig):
    """The dtype weights are stored in (`model.param_dtype`)."""
    return jnp.dtype(config.param_dtype.value)


def compute_dtype(config: ModelConfig):
    """The dtype activations are computed in (`model.activation_dtype`)."""
    return jnp.dtype(config.activation_dtype.value)


class Linear(nnx.Linear):
    """`nnx.Linear` over [..., d_in] run as one 2-D matmul over every leading position. On a
    [B, T, d_in] input XLA differentiates the weight as a contraction over two dimensions and
    inserts transposing copies; flattened, the weight gradient is one plain matmul (CPU: a
    SwiGLU MLP's forward + backward at [2, 2,560, 256] x 768 took 229 ms 3-D, 168 ms flattened;
    experiments/LOG.md, session 7)."""

    # takes no `out_sharding`: the flattened matmul keeps the base's sharding of the kernel
    def __call__(self, x: Array) -> Array:  # type: ignore[override]
        lead = x.shape[:-1]
        return super().__call__(x.reshape(-1, x.shape[-1])).reshape(*lead, -1)


def linear(d_in: int, d_out: int, config: ModelConfig, rngs: nnx.Rngs) -> Linear:
    return Linear(
        d_in,
        d_out,
        use_bias=False,
        dtype=compute_dtype(config),
        param_dtype=param_dtype(config),
        kernel_init=nnx.initializers.normal(config.init_std),
        rngs=rngs,
    )


class RMSNorm(nnx.Module):
    """y = x / rms(x) * scale, computed in float32 and cast back (as Hugging Face does)."""

    def __init__(self, dim: int, eps: float, dtype):
        self.scale = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(x.dtype) * x32.astype(x.dtype)


def rope_inverse_frequencies(config: ModelConfig) -> Array:
    """Per-pair rotation frequencies [h/2], with Llama-3.1's "llama3" scaling when enabled."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (
        config.rope_theta ** (jnp.arange(half, dtype=jnp.float32) * 2 / config.head_dim)
    )
    if config.rope_scaling_factor == 1.0:
        return inv_freq
    factor = config.rope_scaling_factor
    low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
    old_len = config.rope_original_max_positions
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return jnp.where(medium, smoothed, scaled)


def apply_rope(x: Array, positions: Array, inv_freq: Array) -> Array:
    """Rotate x [B, T, heads, h] by positions [B, T] (the split-halves layout of HF Qwen3/Llama)."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, h/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def masked_attention(q: Array, k: Array, v: Array, mask: Array) -> Array:
    """q [B,T,H,h], k/v [B,T,K,h] under mask [B,T,T] (True = may attend) -> [B,T,H*h]."""
    b, t, heads, h = q.shape
    k_heads = k.shape[2]
    q = q.reshape(b, t, k_heads, heads // k_heads, h)
    scores = jnp.einsum("btkrh,bskh->bkrts", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None], scores * (h**-0.5), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkrts,bskh->btkrh", probs, v).reshape(b, t, heads * h)


def attend_cached(
    q: Array,
    k: Array,
    v: Array,
    valid: Array,
    cache: tuple[Array, Array],
    cache_index,
    window: int = 0,
) -> tuple[Array, tuple[Array, Array]]:
    """Attention of T new tokens over a KV cache: q [B,T,H,h], k/v [B,T,K,h], valid [B,S],
    cache [B,E,S,h] -> out [B,T,H*h] and the cache with the new keys/values written at slots
    [cache_index, +T).

    The cache is head-major ([B,E,S,h], as vLLM's paged cache): the score and output products
    are dot_generals batched over (B, E), which XLA's CPU backend runs on the cache in place;
    with slots before heads ([B,S,E,h]) it transposed every layer's whole cache every decode
    iteration (about half the body's time at W1's 64 slots, experiments/LOG.md, session 15).

    New token i sits at slot cache_index + i and attends every valid slot up to its own, so the
    scores are [B,H,T,S] per layer: one row per new token during decode (T = 1), one chunk of
    the prompt during chunked prefill, never [S,S]. A cache of E > K heads holds each KV head
    E/K times (a tensor-parallel engine with more devices than KV heads, as vLLM does). With
    `window` > 0 a token attends only the slots fewer than `window` behind it (Gemma4's local
    layers; a row's slots are consecutive positions, so slot distance is token distance). A [B]
    `cache_index` gives each row its own slot (continuous batching: rows admitted at different
    iterations), written by a per-row update. A `PagedLayer` in place of the pair is the paged
    cache's decode (`paged.attend_paged`; `valid` and `cache_index` unused)."""
    if isinstance(cache, PagedLayer):
        return attend_paged(q, k, v, cache, window)
    b, t, heads, h = q.shape
    e = cache[0].shape[1]
    if e != k.shape[2]:
        k, v = (jnp.repeat(x, e // k.shape[2], axis=2) for x in (k, v))
    k, v = (jnp.swapaxes(x, 1, 2) for x in (k, v))  # [B,E,T,h]: the cache's layout
    if jnp.ndim(cache_index) == 0:
        write = lambda c, x: jax.lax.dynamic_update_slice(c, x, (0, 0, cache_index, 0))
    else:
        one_row = lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (0, i, 0))
        write = lambda c, x: jax.vmap(one_row)(c, x, cache_index)
    cache_k, cache_v = (write(c, x.astype(c.dtype)) for c, x in zip(cache, (k, v), strict=True))
    index = jnp.broadcast_to(cache_index, (b,))
    slots = cache_k.shape[2]
    behind = (index[:, None] + jnp.arange(t))[:, :, None] - jnp.arange(slots)[None, None, :]
    causal = (behind >= 0) & (behind < window) if window else behind >= 0  # [B, T, S]
    mask = causal & valid[:, None, :]
    q = q.reshape(b, t, e, heads // e, h)
    scores = jnp.einsum("btkrh,bksh->bkrts", q, cache_k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None], scores * (h**-0.5), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(cache_v.dtype)
    return _attend_values(probs, cache_v).astype(q.dtype), (cache_k, cache_v)


def _attend_values(probs: Array, cache_v: Array) -> Array:
    """probs [B,E,R,T,S] over values [B,E,S,h] -> [B,T,E*R*h].

    Written as one [R*T, S] x [S, h] product per (B, E), the output's [R*T, h] rows then moved
    behind T. Asked for as [B,T,E,R,h] directly ("bkrts,bksh->btkrh"), XLA's CPU backend
    lowered it to a dot with the cache as the transposed left operand, which its YNNPACK
    fusions do not take: a plain dot 20x slower at Table 1's 2,304 slots, most of the decode
    iteration's attention (experiments/LOG.md, 2026-12-06, session 22)."""
    b, e, r, t, s = probs.shape
    out = jnp.einsum("bkxs,bksh->bkxh", probs.reshape(b, e, r * t, s), cache_v)
    return out.reshape(b, e, r, t, -1).transpose(0, 3, 1, 2, 4).reshape(b, t, -1)
