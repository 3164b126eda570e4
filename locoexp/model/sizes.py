"""Parameter counts of a `ModelConfig` without allocating the model.

`count_parameters` traces `build_model` under `jax.eval_shape`, so the count is whatever the one
decoder implementation actually holds (a 405B config costs a trace, not 1.6 TB of memory). It
traces the model at one and two layers and extrapolates, which is exact because every block is
the same: tracing all 126 layers of Llama-3.1-405B takes ~12 s, because NNX probes each new
abstract parameter's `.sharding` and jax 0.10 builds an error message over the whole trace for it
(quadratic in the number of parameters).
`count_parameters_by_formula` is the closed form of the same tree, used by the memory estimate
and to check the synthetic models of Section 3.2, which have no published size.
This module counts; it never initialises weights or touches devices.
"""

import dataclasses
import math

import jax
from flax import nnx

from locoexp.model.config import ModelConfig
from locoexp.model.transformer import build_model


def abstract_params(config: ModelConfig) -> nnx.State:
    """The model's parameter state as `jax.ShapeDtypeStruct` leaves (nothing allocated)."""
    return jax.eval_shape(lambda: nnx.state(build_model(config, seed=0), nnx.Param))


def count_traced_parameters(config: ModelConfig) -> int:
    """Total parameters of the full traced model (slow beyond ~30 layers; see the module note)."""
    leaves = jax.tree_util.tree_leaves(abstract_params(config))
    return sum(math.prod(leaf.shape) for leaf in leaves)


def count_parameters(config: ModelConfig) -> int:
    """Total parameters, embeddings (and an untied output head) included. Gemma4 has two kinds
    of block: a 1-layer trace is one global block, a 2-layer trace at every=2 adds a local one."""
    one = count_traced_parameters(dataclasses.replace(config, num_layers=1))
    if config.gemma4:
        pair = dataclasses.replace(config, num_layers=2, global_attention_every=2)
        local = count_traced_parameters(pair) - one
        globals_ = sum(config.is_global_layer(i) for i in range(config.num_layers))
        global_ = one - count_embedding_parameters(config) - config.hidden_dim
        return one + (globals_ - 1) * global_ + (config.num_layers - globals_) * local
    two = count_traced_parameters(dataclasses.replace(config, num_layers=2))
    return one + (config.num_layers - 1) * (two - one)


def count_embedding_parameters(config: ModelConfig) -> int:
    """Parameters of the token embedding plus the output head when it is untied (V x D each)."""
    tables = 1 if config.tie_embeddings else 2
    return tables * config.vocab_size * config.hidden_dim


def block_projections(config: ModelConfig) -> list[tuple[int, int]]:
    """(in, out) of each decoder block's matmul weights: q, k, v, o, then SwiGLU gate, up, down."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    d, f = config.hidden_dim, config.mlp_dim
    return [(d, q), (d, kv), (d, kv), (q, d), (d, f), (d, f), (f, d)]


def count_block_matmul_parameters(config: ModelConfig) -> int:
    """One decoder block's matmul weights (attention projections and SwiGLU MLP)."""
    return sum(d_in * d_out for d_in, d_out in block_projections(config))


def count_block_parameters(
    config: ModelConfig, *, experts: int | None = None, layer: int | None = None
) -> int:
    """One decoder block: its matmul weights + q/k norms + its two RMSNorm scales. A
    mixture-of-experts block holds the router [D, E] and E expert MLPs instead of the MLP;
    `experts` counts only that many of them (the top-k a token uses: the active parameters).
    Gemma4: block `layer`'s (default the largest, a global one; `_gemma4_block`)."""
    c = config
    if c.gemma4:
        return _gemma4_block(c, c.is_global_layer(c.num_layers - 1 if layer is None else layer),
                             experts)  # fmt: skip
    qk_norms = 2 * c.head_dim if c.qk_norm else 0
    if not c.moe:
        return count_block_matmul_parameters(c) + qk_norms + 2 * c.hidden_dim
    attention = sum(d_in * d_out for d_in, d_out in block_projections(c)[:4])  # q, k, v, o
    used = c.num_experts if experts is None else experts
    mlp = c.hidden_dim * c.num_experts + used * 3 * c.hidden_dim * c.expert_mlp_dim
    return attention + qk_norms + mlp + 2 * c.hidden_dim


def count_expert_parameters(config: ModelConfig) -> int:
    """Parameters of all experts of all blocks (what expert parallelism shards); 0 if dense."""
    if not config.moe:
        return 0
    return config.num_layers * config.num_experts * 3 * config.hidden_dim * config.expert_mlp_dim


def count_active_parameters(config: ModelConfig) -> int:
    """Parameters one token's forward uses: every dense part, the router and its top-k experts
    (the "A3B" of Qwen3-30B-A3B, the "A4B" of Gemma4-26B-A4B); the total for a dense model."""
    if not config.moe:
        return count_parameters_by_formula(config)
    return _sum_blocks(config, experts=config.experts_per_token)


def count_parameters_by_formula(config: ModelConfig) -> int:
    """Closed form: embeddings + the blocks + the final norm."""
    return _sum_blocks(config, experts=None)


def _sum_blocks(config: ModelConfig, *, experts: int | None) -> int:
    blocks = sum(
        count_block_parameters(config, experts=experts, layer=i) for i in range(config.num_layers)
    )
    return count_embedding_parameters(config) + blocks + config.hidden_dim


def _gemma4_block(config: ModelConfig, is_global: bool, experts: int | None) -> int:
    """Gemma4's block (`locoexp/model/gemma4.py`): its attention geometry by kind (a global
    one with `global_key_is_value` has no v_proj), q/k norms, the GeLU MLP, 4 sandwich norms
    and the layer scalar; with experts, the router (projection, scale, per-expert scale), the
    experts and 3 more norms."""
    c = config
    kv_heads, h = c.layer_kv_shape(c.num_layers - 1 if is_global else 0)
    kv_projections = 1 if is_global and c.global_key_is_value else 2
    attention = c.hidden_dim * h * (2 * c.num_heads + kv_projections * kv_heads) + 2 * h
    block = attention + 3 * c.hidden_dim * c.mlp_dim + 4 * c.hidden_dim + 1
    if c.moe:
        used = c.num_experts if experts is None else experts
        router = c.hidden_dim * c.num_experts + c.hidden_dim + c.num_experts
        block += router + used * 3 * c.hidden_dim * c.expert_mlp_dim + 3 * c.hidden_dim
    return block
