"""The decoder (Qwen3; Llama-3.1 with `qk_norm=False`; Qwen3-MoE with `num_experts > 0`) in NNX.

One implementation serves training (full sequences, packed rows with segment masks) and
generation (a KV cache written at a given slot). It owns the numerics of the forward pass only:
it never samples, never computes a loss and never knows about hosts or meshes.

Shapes: B rows, T query tokens, S key slots (cache length), D width, K KV heads, R = heads / K
(query heads per KV head), h head_dim, V vocabulary, E cache heads (K, or more when a
tensor-parallel engine repeats KV heads: `init_cache(..., heads=E)`).
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from locoexp.model.attention import AttentionSpec, attend, causal_segment_mask, constrain_rows
from locoexp.model.config import ModelConfig, RematPolicy
from locoexp.model.gemma4 import Gemma4Block
from locoexp.model.layers import (
    Linear,
    RMSNorm,
    apply_rope,
    attend_cached,
    compute_dtype,
    linear,
    masked_attention,
    param_dtype,
    rope_inverse_frequencies,
)
from locoexp.model.moe import MoE, RouterStats, load_balancing_loss, no_router_stats
from locoexp.model.paged import PagedLayer
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
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype(c))
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype(c))

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
        dtype = param_dtype(config)
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
    # one partial per layer kind, so `build_model` compiles each kind's init once
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
        dtype=compute_dtype(config),
        param_dtype=param_dtype(config),
        embedding_init=nnx.initializers.normal(config.init_std),
        rngs=rngs,
    )


def _final_norm(config: ModelConfig, rngs: nnx.Rngs) -> RMSNorm:
    del rngs  # ones: no key drawn
    return RMSNorm(config.hidden_dim, config.rms_norm_eps, param_dtype(config))


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
    dtype = dtype or param_dtype(config)

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
