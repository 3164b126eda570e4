"""The decoder (Qwen3; Llama-3.1 with `qk_norm=False`; Qwen3-MoE with `num_experts > 0`) in NNX.

One implementation serves training (full sequences, packed rows with segment masks) and
generation (a KV cache written at a given slot). It owns the numerics of the forward pass only:
it never samples, never computes a loss and never knows about hosts or meshes.

Shapes: B rows, T query tokens, S key slots (cache length), D width, K KV heads, R = heads / K
(query heads per KV head), h head_dim, V vocabulary, E cache heads (K, or more when a
tensor-parallel engine repeats KV heads: `init_cache(..., heads=E)`).
"""

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from locoexp.model.attention import AttentionSpec, attend, causal_segment_mask, constrain_rows
from locoexp.model.config import ModelConfig, RematPolicy
from locoexp.model.moe import MoE, RouterStats, load_balancing_loss, no_router_stats
from locoexp.model.paged import PagedLayer, attend_paged
from locoexp.model.remat import call_block_outputs, checkpoint_policy

__all__ = [
    "Transformer",
    "build_model",
    "causal_segment_mask",
    "init_cache",
    "load_balancing_loss",
    "router_loss",
]

Array = jax.Array
KVCache = tuple[tuple[Array, Array], ...]  # per layer: keys and values [B, E, S, h]

_MASKED = -1e30  # finite so that fully masked (padding) rows give uniform, not NaN, weights


def _dtype(config: ModelConfig):
    return jnp.dtype(config.param_dtype.value)


def _compute(config: ModelConfig):
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
        dtype=_compute(config),
        param_dtype=_dtype(config),
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


class Attention(nnx.Module):
    """Grouped-query attention with optional per-head q/k RMSNorm and an optional KV cache."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = linear(c.hidden_dim, c.num_heads * c.head_dim, c, rngs)
        self.k_proj = linear(c.hidden_dim, c.num_kv_heads * c.head_dim, c, rngs)
        self.v_proj = linear(c.hidden_dim, c.num_kv_heads * c.head_dim, c, rngs)
        self.o_proj = linear(c.num_heads * c.head_dim, c.hidden_dim, c, rngs)
        self.qk_norm = c.qk_norm
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, _dtype(c))
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, _dtype(c))

    def __call__(
        self, x, positions, mask, inv_freq, cache=None, cache_index=None, *, segment_ids=None,
        attention=None,
    ):  # fmt: skip
        """x [B,T,D], positions [B,T] -> [B,T,D], cache.

        Without a cache, mask [B,T,T] (True = may attend). With one, mask [B,S] marks the slots
        holding real tokens (see `attend_cached`). The trainer path passes `segment_ids` [B,T]
        and an `AttentionSpec` instead of a mask."""
        b, t, _ = x.shape
        k_heads, h = self.num_kv_heads, self.head_dim
        q = self.q_proj(x).reshape(b, t, self.num_heads, h)
        k = self.k_proj(x).reshape(b, t, k_heads, h)
        v = self.v_proj(x).reshape(b, t, k_heads, h)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
        if segment_ids is not None:  # packed training rows: no [T, S] mask, no cache
            q, k, v = (constrain_rows(attention, a) for a in (q, k, v))
            out = attend(attention, q, k, v, segment_ids).reshape(b, t, self.num_heads * h)
            return self.o_proj(out), None
        if cache is not None:
            out, cache = attend_cached(q, k, v, mask, cache, cache_index)
            return self.o_proj(out), cache
        return self.o_proj(masked_attention(q, k, v, mask)), cache


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


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.gate_proj = linear(config.hidden_dim, config.mlp_dim, config, rngs)
        self.up_proj = linear(config.hidden_dim, config.mlp_dim, config, rngs)
        self.down_proj = linear(config.mlp_dim, config.hidden_dim, config, rngs)

    def __call__(self, x: Array) -> Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):
    """Pre-norm residual block: attention then MLP."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        dtype = _dtype(config)
        self.input_norm = RMSNorm(config.hidden_dim, config.rms_norm_eps, dtype)
        self.attn = Attention(config, rngs)
        self.post_attn_norm = RMSNorm(config.hidden_dim, config.rms_norm_eps, dtype)
        self.mlp = self.build_mlp(config, rngs)

    @staticmethod
    def build_mlp(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
        return MLP(config, rngs)

    def attend(self, x, positions, mask, inv_freq, cache, cache_index, **packed):
        """The attention half: x + attn(norm(x)) and the cache."""
        attn_out, cache = self.attn(
            self.input_norm(x), positions, mask, inv_freq, cache, cache_index, **packed
        )
        return x + attn_out, cache

    def __call__(self, x, positions, mask, inv_freq, cache=None, cache_index=None, **packed):
        x, cache = self.attend(x, positions, mask, inv_freq, cache, cache_index, **packed)
        return x + self.mlp(self.post_attn_norm(x)), cache


class MoEBlock(Block):
    """Qwen3-MoE's block: the dense block with the sparse mixture of experts as its MLP. It also
    returns its router statistics over the real tokens (segment id > 0 when packed)."""

    @staticmethod
    def build_mlp(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
        return MoE(config, rngs)

    def __call__(self, x, positions, mask, inv_freq, cache=None, cache_index=None, **packed):
        x, cache = self.attend(x, positions, mask, inv_freq, cache, cache_index, **packed)
        real = packed["segment_ids"] > 0 if packed else None
        out, stats = self.mlp(self.post_attn_norm(x), real)
        return x + out, cache, stats


def layer_block(config: ModelConfig, layer: int):
    """The block class (or a partial of it) layer `layer` of `config` uses: the dense block, the
    mixture-of-experts block, or Gemma4's local or global block."""
    if config.gemma4:
        return _gemma4_block(config.is_global_layer(layer))
    return MoEBlock if config.moe else Block


@functools.cache
def _gemma4_block(is_global: bool):
    # one partial per layer kind, so `build_model` compiles each kind's init once; gemma4.py
    # builds on this module's layers, hence the import here
    from locoexp.model.gemma4 import Gemma4Block

    return functools.partial(Gemma4Block, is_global=is_global)


def rope_frequencies(config: ModelConfig):
    """The RoPE frequencies the blocks take: [h/2], or Gemma4's (local, global) pair."""
    if not config.gemma4:
        return rope_inverse_frequencies(config)
    return (
        proportional_frequencies(config.rope_theta, config.head_dim, 1.0),
        proportional_frequencies(
            config.global_rope_theta, config.global_head_dim, config.global_rotary_fraction
        ),
    )


def proportional_frequencies(theta: float, head_dim: int, fraction: float) -> Array:
    """Per-pair RoPE frequencies [h/2]: the first int(fraction * h / 2) pairs rotate at
    theta^(-2i/h), the rest not at all (HF's "proportional" RoPE of Gemma4's global layers;
    fraction 1 is default RoPE)."""
    rotated = int(fraction * head_dim // 2)
    inv_freq = 1.0 / (theta ** (jnp.arange(rotated, dtype=jnp.float32) * 2 / head_dim))
    return jnp.concatenate([inv_freq, jnp.zeros(head_dim // 2 - rotated, jnp.float32)])


def _embedding(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Embed:
    return nnx.Embed(
        config.vocab_size,
        config.hidden_dim,
        dtype=_compute(config),
        param_dtype=_dtype(config),
        embedding_init=nnx.initializers.normal(config.init_std),
        rngs=rngs,
    )


def _final_norm(config: ModelConfig, rngs: nnx.Rngs) -> RMSNorm:
    del rngs  # ones: no key drawn
    return RMSNorm(config.hidden_dim, config.rms_norm_eps, _dtype(config))


def _output_head(config: ModelConfig, rngs: nnx.Rngs) -> Linear:
    return linear(config.hidden_dim, config.vocab_size, config, rngs)


class Transformer(nnx.Module):
    """Token embedding, `num_layers` blocks, final RMSNorm and a tied or untied output head."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        # `build_model` initialises the same parts in the same order, one program per part
        self.config = config
        self.embed = _embedding(config, rngs)
        self.layers = nnx.List(
            [layer_block(config, i)(config, rngs) for i in range(config.num_layers)]
        )
        self.final_norm = _final_norm(config, rngs)
        if not config.tie_embeddings:
            self.lm_head = _output_head(config, rngs)

    def __call__(
        self,
        tokens: Array,
        positions: Array,
        mask: Array | None,
        cache: KVCache | tuple[PagedLayer, ...] | None = None,
        cache_index: Array | None = None,
    ) -> tuple[Array, KVCache | tuple[PagedLayer, ...] | None]:
        """tokens, positions [B,T] -> final hidden states [B,T,D] and the cache.

        Without a cache, mask [B,T,T] (True = may attend). With a cache, mask [B,S] marks the
        slots that hold real tokens (False for left padding): keys/values of the T new tokens
        are written at slots [cache_index, cache_index + T) and each new token attends the
        valid slots up to its own. A paged cache (one `PagedLayer` per layer, decode only) takes
        no mask and no index: each layer says where its token goes (`paged.attend_paged`).
        """
        inv_freq = rope_frequencies(self.config)
        x = self.embed_tokens(tokens)
        new_cache = []
        for i, layer in enumerate(self.layers):
            x, layer_cache, *_ = layer(
                x, positions, mask, inv_freq, None if cache is None else cache[i], cache_index
            )
            new_cache.append(layer_cache)
        return self.final_norm(x), (None if cache is None else tuple(new_cache))

    def packed_hidden(
        self,
        tokens: Array,
        positions: Array,
        segment_ids: Array,
        *,
        attention: AttentionSpec,
        remat: RematPolicy = RematPolicy.none,
    ) -> Array:
        """The trainer's forward: packed rows tokens, positions, segment_ids [B,T] -> final
        hidden states [B,T,D], attending with `attention` and no [T, T] mask; each block's
        activations kept or recomputed as `remat` says."""
        return self.packed_hidden_and_router(
            tokens, positions, segment_ids, attention=attention, remat=remat
        )[0]

    def packed_hidden_and_router(
        self,
        tokens: Array,
        positions: Array,
        segment_ids: Array,
        *,
        attention: AttentionSpec,
        remat: RematPolicy = RematPolicy.none,
    ) -> tuple[Array, RouterStats | None]:
        """`packed_hidden` and the router statistics summed over the MoE blocks (None for a
        dense model): `router_loss` turns them into the load-balancing loss."""
        inv_freq = rope_frequencies(self.config)
        x = constrain_rows(attention, self.embed_tokens(tokens))
        stats = no_router_stats(self.config.num_experts) if self.config.moe else None
        kwargs = dict(positions=positions, mask=None, inv_freq=inv_freq, segment_ids=segment_ids)
        if blocks_scan(self.layers, remat):
            x, layer_stats = scanned_blocks(self.layers, x, remat, attention=attention, **kwargs)
            stats = stats + layer_stats if layer_stats is not None else stats
            return self.final_norm(x), stats
        for layer in self.layers:
            x, _, *layer_stats = call_block_outputs(layer, x, remat, attention=attention, **kwargs)
            x = constrain_rows(attention, x)
            if layer_stats:
                stats = stats + layer_stats[0]
        return self.final_norm(x), stats

    def embed_tokens(self, tokens: Array) -> Array:
        """tokens [B,T] -> [B,T,D]; Gemma4 scales the embedding by sqrt(D) (in its dtype)."""
        x = self.embed(tokens)
        if self.config.gemma4:
            x = x * jnp.asarray(self.config.hidden_dim**0.5, x.dtype)
        return x

    def logits(self, hidden: Array) -> Array:
        """Output head: hidden [..., D] -> logits [..., V] in float32 (soft-capped when
        `final_logit_softcap` > 0: cap * tanh(logits / cap), Gemma4)."""
        if self.config.tie_embeddings:
            out = hidden @ self.embed.embedding[...].T
        else:
            out = self.lm_head(hidden)
        return softcap(out.astype(jnp.float32), self.config.final_logit_softcap)


def blocks_scan(layers, remat: RematPolicy) -> bool:
    """Whether the trainer's forward runs `layers` as one scan (`scanned_blocks`): rematerialised,
    more than one, and all of one structure (Gemma4's local and global blocks differ and stay
    unrolled). A scanned step's compile does not grow with the depth (`compiled/verdict.py`)."""
    if remat is RematPolicy.none or len(layers) < 2:
        return False
    graphdefs = [nnx.graphdef(layer) for layer in layers]
    return all(g == graphdefs[0] for g in graphdefs[1:])


def scanned_blocks(layers, x: Array, remat: RematPolicy, *, attention, **kwargs):
    """The blocks as one `lax.scan` over their stacked parameters, each step rematerialised as
    `remat` says: (hidden states, router statistics summed over the blocks, or None for a
    dense model); the blocks are of one structure (`blocks_scan`).

    Unrolled blocks under `jax.checkpoint` do not bound the train step's memory on XLA-TPU: it
    schedules every block's recomputation where it likes and keeps their activations alive
    together. Qwen3-0.6B's GSM8K train step on tpu_v7x_8 (128 rows of 2,560 tokens per device)
    compiled to 57.1 GiB of temporaries at 2 layers with `trainer.remat=block` against 56.2
    without it, 17.6 GiB more per layer (XLA-TPU's memory analysis, experiments/LOG.md, session
    23). A scan's backward loop recomputes one block per iteration, as MaxText's scanned layers
    (`scan_layers`) do."""
    graphdefs, states = zip(*(nnx.split(layer) for layer in layers), strict=True)
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)

    def run(state, x):
        return nnx.merge(graphdefs[0], state)(x, attention=attention, **kwargs)

    step = jax.checkpoint(run, policy=checkpoint_policy(remat))

    def body(x, state):
        x, _, *layer_stats = step(state, x)
        return constrain_rows(attention, x), (layer_stats[0] if layer_stats else None)

    x, per_layer = jax.lax.scan(body, x, stacked)
    summed = None if per_layer is None else jax.tree.map(lambda a: a.sum(0), per_layer)
    return x, summed


def softcap(logits: Array, cap: float) -> Array:
    """cap * tanh(logits / cap); the logits unchanged when cap is 0."""
    return cap * jnp.tanh(logits / cap) if cap else logits


def init_cache(
    config: ModelConfig, batch: int, slots: int, dtype=None, *, heads: int | None = None
) -> KVCache:
    """Zeroed KV cache [batch, heads, slots, head_dim] per layer (head-major: see
    `attend_cached`); `heads` defaults to the KV heads, a multiple of them repeats each KV
    head."""
    dtype = dtype or _dtype(config)

    def layer(i: int) -> tuple[Array, Array]:
        kv_heads, head_dim = config.layer_kv_shape(i)
        shape = (batch, max(heads or kv_heads, kv_heads), slots, head_dim)
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    return tuple(layer(i) for i in range(config.num_layers))


def build_model(config: ModelConfig, *, seed: int) -> Transformer:
    """A randomly initialised decoder (checkpoint loading lives in `locoexp.model.checkpoint`).

    Initialised part by part, each part in a jitted program (`_init_part`): the embedding, one
    program compiled once and run for every block, the final norm, and the output head when
    untied, each drawing the keys `nnx.Rngs(params=seed)` hands out in `Transformer.__init__`'s
    order, so the weights are those of the whole model initialised at once
    (tests/test_model_init.py). One program for the whole model let XLA on CPU keep every
    parameter's random-number temporaries alive together: Qwen3-0.6B in bfloat16 compiled to
    5.71 GB of temporaries for 1.19 GB of weights, and every local host peaked at 7.6 GB RSS
    while it started.
    """
    graphdef, state = nnx.split(
        nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(params=seed)))
    )
    # compiled once per part kind (ModelConfig is not hashable: it is bound, not static)
    init = jax.jit(functools.partial(_init_part, config=config), static_argnums=0)
    key = jax.random.key(seed)  # what nnx.Rngs(params=seed) starts from
    parts, count = {}, jnp.zeros((), jnp.uint32)
    parts["embed"], count = init(_embedding, key, count)
    parts["layers"] = {}
    for i in range(config.num_layers):
        parts["layers"][i], count = init(layer_block(config, i), key, count)
    parts["final_norm"], count = init(_final_norm, key, count)
    if not config.tie_embeddings:
        parts["lm_head"], count = init(_output_head, key, count)
    nnx.replace_by_pure_dict(state, parts)
    return nnx.merge(graphdef, state)


def _init_part(make, key: Array, count: Array, *, config: ModelConfig):
    """`make(config, rngs)`'s parameters, its keys drawn from `nnx.Rngs(params=key)` from the
    `count`-th on; and the count after them (the next part's first key)."""
    rngs = nnx.Rngs(params=key)
    rngs.params.count[...] = count
    module = make(config, rngs)
    return nnx.to_pure_dict(nnx.state(module, nnx.Param)), rngs.params.count[...]


def router_loss(stats: RouterStats | None) -> Array:
    """The load-balancing loss of a forward's router statistics; 0 for a dense model."""
    return jnp.zeros((), jnp.float32) if stats is None else load_balancing_loss(stats)
