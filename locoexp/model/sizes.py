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
    """Total parameters, embeddings (and an untied output head) included."""
    one = count_traced_parameters(dataclasses.replace(config, num_layers=1))
    two = count_traced_parameters(dataclasses.replace(config, num_layers=2))
    return one + (config.num_layers - 1) * (two - one)


def count_embedding_parameters(config: ModelConfig) -> int:
    """Parameters of the token embedding plus the output head when it is untied (V x D each)."""
    tables = 1 if config.tie_embeddings else 2
    return tables * config.vocab_size * config.hidden_dim


def count_block_parameters(config: ModelConfig, *, experts: int | None = None) -> int:
    """One decoder block: attention (+ q/k norms) + SwiGLU MLP + its two RMSNorm scales. A
    mixture-of-experts block holds the router [D, E] and E expert MLPs instead of the MLP;
    `experts` counts only that many of them (the top-k a token uses: the active parameters)."""
    c = config
    attention = c.hidden_dim * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)  # q,o and k,v
    qk_norms = 2 * c.head_dim if c.qk_norm else 0
    mlp = 3 * c.hidden_dim * c.mlp_dim  # gate, up, down
    if c.moe:
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
    (the "A3B" of Qwen3-30B-A3B); the total for a dense model."""
    if not config.moe:
        return count_parameters_by_formula(config)
    block = count_block_parameters(config, experts=config.experts_per_token)
    return count_embedding_parameters(config) + config.num_layers * block + config.hidden_dim


def count_parameters_by_formula(config: ModelConfig) -> int:
    """Closed form: embeddings + L x block + the final norm."""
    return (
        count_embedding_parameters(config)
        + config.num_layers * count_block_parameters(config)
        + config.hidden_dim
    )
