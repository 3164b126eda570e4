"""The sparse mixture-of-experts MLP (Qwen3-MoE's `Qwen3MoeSparseMoeBlock`) and its router loss.

Each token's router logits (a bias-free linear map to E experts) go through a float32 softmax;
the token is sent to its top-k experts with those probabilities as weights (renormalised to sum
to 1 when `normalize_top_k`, Qwen3-30B-A3B's `norm_topk_prob`), and its output is the weighted
sum of the k experts' SwiGLU outputs. Computation is dropless: the N*k (token, expert) pairs are
sorted by expert and each expert's contiguous run goes through one grouped matmul
(`jax.lax.ragged_dot`), so only the routed pairs cost FLOPs and no token is dropped (parity with
transformers needs that). The routed tokens' buffer is [N*k, D] in, [N*k, I] inside, [N*k, D]
out; the planner counts it (`locoexp/planner/estimate.py`).

The load-balancing loss is Switch Transformer's Eqs. 4-6 as transformers' `load_balancing_loss_func`
computes it over every MoE layer: E * sum_e f_e * P_e, with f_e the share of routed slots that
chose expert e (summing to k) and P_e the mean router probability of e, both over the real
(non-padding) tokens of all layers. Blocks return `RouterStats` sums that add over layers.

It owns routing and the expert math; it never knows about meshes (expert parallelism shards the
[E, ...] weights from outside) or losses beyond the router's own statistic.

Shapes: N tokens, D width, E experts, k experts per token, I expert width.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from locoexp.model.config import ModelConfig

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RouterStats:
    """Sums over real tokens (and layers): routed slots per expert [E], router probability per
    expert [E], and the count of (token, layer) rows they were summed over."""

    slots: Array
    probs: Array
    rows: Array

    def __add__(self, other: "RouterStats") -> "RouterStats":
        return jax.tree.map(jnp.add, self, other)


def load_balancing_loss(stats: RouterStats) -> Array:
    """E * sum_e f_e * P_e (transformers' `load_balancing_loss_func`); 1.0 at perfect balance
    with k = 1, k at perfect balance in general."""
    rows = jnp.maximum(stats.rows, 1.0)
    return stats.slots.shape[0] * jnp.sum((stats.slots / rows) * (stats.probs / rows))


def route(logits: Array, k: int, normalize: bool) -> tuple[Array, Array, Array]:
    """Router logits [N, E] -> probabilities [N, E] (float32), top-k weights [N, k] and expert
    ids [N, k] (descending probability, ties to the lower id as torch.topk)."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, k)
    if normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return probs, weights, experts


def expert_outputs(
    x: Array,
    experts: Array,
    weights: Array,
    gate: Array,
    up: Array,
    down: Array,
    *,
    activation: Callable[[Array], Array] = jax.nn.silu,
) -> Array:
    """sum_j weights[n, j] * GLU_{experts[n, j]}(x[n]): x [N, D], experts and weights [N, k],
    gate and up [E, D, I], down [E, I, D] -> [N, D], one grouped matmul per projection; the
    gate's `activation` is SiLU (Qwen3-MoE) or GeLU (Gemma4)."""
    n, k = experts.shape
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
    token = order // k
    group_sizes = jnp.bincount(flat, length=gate.shape[0]).astype(jnp.int32)
    routed = x[token]  # [N*k, D]: the routed tokens' buffer
    hidden = activation(jax.lax.ragged_dot(routed, gate, group_sizes)) * jax.lax.ragged_dot(
        routed, up, group_sizes
    )
    out = jax.lax.ragged_dot(hidden, down, group_sizes)  # [N*k, D]
    out = out * weights.reshape(-1)[order][:, None].astype(out.dtype)
    return jnp.zeros_like(x).at[token].add(out)


class MoE(nnx.Module):
    """Router (`router`, [D, E]) and E SwiGLU experts stacked along a leading expert axis."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c = config
        dtype = jnp.dtype(c.param_dtype.value)
        init = nnx.initializers.normal(c.init_std)
        self.k, self.normalize = c.experts_per_token, c.normalize_top_k
        self.router = nnx.Param(init(rngs.params(), (c.hidden_dim, c.num_experts), dtype))
        shape_in = (c.num_experts, c.hidden_dim, c.expert_mlp_dim)
        self.gate_proj = nnx.Param(init(rngs.params(), shape_in, dtype))
        self.up_proj = nnx.Param(init(rngs.params(), shape_in, dtype))
        shape_out = (c.num_experts, c.expert_mlp_dim, c.hidden_dim)
        self.down_proj = nnx.Param(init(rngs.params(), shape_out, dtype))

    def __call__(self, x: Array, real: Array | None = None) -> tuple[Array, RouterStats]:
        """x [..., D] -> output [..., D] and this layer's router statistics over the tokens
        where `real` [...] is True (every token when None)."""
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1])
        probs, weights, experts = route(flat @ self.router[...], self.k, self.normalize)
        out = expert_outputs(
            flat, experts, weights, self.gate_proj[...], self.up_proj[...], self.down_proj[...]
        )
        return out.reshape(*lead, -1), router_stats(probs, experts, real)


def router_stats(probs: Array, experts: Array, real: Array | None) -> RouterStats:
    """One layer's statistics from its router probabilities [N, E] and chosen experts [N, k]
    over the tokens where `real` (any shape of N elements) is True; every token when None."""
    mask = jnp.ones(probs.shape[0], jnp.float32) if real is None else real.reshape(-1)
    mask = mask.astype(jnp.float32)
    chosen = jax.nn.one_hot(experts, probs.shape[-1], dtype=jnp.float32).sum(axis=1)
    return RouterStats(
        slots=(chosen * mask[:, None]).sum(0), probs=(probs * mask[:, None]).sum(0), rows=mask.sum()
    )


def no_router_stats(num_experts: int) -> RouterStats:
    """Zero statistics (the sum over no layer)."""
    zeros = jnp.zeros((num_experts,), jnp.float32)
    return RouterStats(slots=zeros, probs=zeros, rows=jnp.zeros((), jnp.float32))
