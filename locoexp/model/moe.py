"""The sparse mixture-of-experts MLP (Qwen3-MoE's `Qwen3MoeSparseMoeBlock`) and its router loss.

Each token's router logits (a bias-free linear map to E experts) go through a float32 softmax;
the token is sent to its top-k experts with those probabilities as weights (renormalised to sum
to 1 when `normalize_top_k`, Qwen3-30B-A3B's `norm_topk_prob`), and its output is the weighted
sum of the k experts' SwiGLU outputs. Computation is dropless: the N*k (token, expert) pairs are
sorted by expert and each expert's contiguous run goes through one grouped matmul
(`grouped_matmul`: `jax.lax.ragged_dot`, its weight gradient on TPU megablox's kernel), so
only the routed pairs cost FLOPs, forward and backward, and no token is dropped (parity with
transformers needs that). The routed tokens' buffer is [N*k, D] in, [N*k, I] inside, [N*k, D]
out; the planner counts it (`locoexp/planner/estimate.py`).

The load-balancing loss is Switch Transformer's Eqs. 4-6 as transformers' `load_balancing_loss_func`
computes it over every MoE layer: E * sum_e f_e * P_e, with f_e the share of routed slots that
chose expert e (summing to k) and P_e the mean router probability of e, both over the real
(non-padding) tokens of all layers. Blocks return `RouterStats` sums that add over layers.

Where tokens are routed: the trainer and the engine trace their programs under `expert_mesh`,
which makes their mesh ambient and names the axes their tokens are split over (the trainer's:
every axis; the engine's: its data-parallel replicas). `expert_outputs` is then one
`jax.shard_map` over those axes in which each device (replica) routes, sorts and computes its
own tokens (`_routed_per_device`); left to XLA, the global sort made every device route every
token. Expert parallelism: with an `expert` axis of size ep > 1 the stacked [E, ...] weights
arrive split along E over it (each device holds E/ep experts, laid out by the trainer and the
engine) and each device computes its own experts' share of every routed pair of its expert
group (the pairs routed elsewhere are sorted past its groups and weigh 0): the trainer's
devices gather the group's tokens and reduce-scatter the shares back, the engine's (whose
replica's devices hold the same slots) all-reduce them. It is dropless, as the one-device path:
no capacity factor, so the routed buffer per device is every pair of the expert group's tokens,
[N_group*k, D] (the plan's `_routed_bytes`).

It owns routing and the expert math and the one axis name `expert`; where that axis lies and
which arrays are split over it is the trainer's and the engine's (`is_expert_stack`); it knows
no loss beyond the router's own statistic.

Shapes: N tokens, D width, E experts, k experts per token, I expert width.
"""

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as PS

from locoexp.model.config import ModelConfig

Array = jax.Array
EXPERT = "expert"  # the expert-parallel mesh axis
# Parameter names of the stacked [E, ...] expert weights (Qwen3-MoE's MoE, Gemma4's experts): a
# dense MLP's projections of the same names hold a `kernel` (and, under LoRA, their factors
# `lora_a` / `lora_b`, locoexp/adapter/lora.py), the stacks do not.
EXPERT_STACKS = frozenset({"gate_proj", "up_proj", "down_proj", "gate_up_proj"})
_PROJECTION_LEAVES = frozenset({"kernel", "lora_a", "lora_b"})


def is_expert_stack(path: tuple) -> bool:
    """Whether the parameter at `path` (a key path of an nnx.State or pure dict) is an [E, ...]
    expert stack, the arrays expert parallelism splits along E."""
    names = {getattr(k, "key", getattr(k, "name", None)) for k in path}
    return bool(names & EXPERT_STACKS) and not names & _PROJECTION_LEAVES


def expert_mesh(mesh: Mesh, token_axes: tuple[str, ...] = ()) -> contextlib.AbstractContextManager:
    """The context a program over `mesh` is traced in: with `token_axes`, the axes the
    program's tokens are split over (the trainer's: every axis; the engine's: its data-parallel
    replicas), `mesh` made ambient so that each device (or replica) routes its own tokens and
    computes its experts' share (`expert_outputs`); nothing otherwise."""
    if not token_axes:
        return contextlib.nullcontext()
    return _with_token_axes(mesh, tuple(token_axes))


@contextlib.contextmanager
def _with_token_axes(mesh: Mesh, token_axes: tuple[str, ...]):
    token = _TOKEN_AXES.set(token_axes)
    try:
        with jax.set_mesh(mesh):
            yield
    finally:
        _TOKEN_AXES.reset(token)


# The axes of the ambient mesh its program's tokens are split over (`expert_mesh`)
_TOKEN_AXES: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "token_axes", default=()
)


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
    gate's `activation` is SiLU (Qwen3-MoE) or GeLU (Gemma4). Under `expert_mesh`'s token
    axes each device routes its own tokens (`_routed_per_device`); else one routing of all."""
    mesh = jax.sharding.get_abstract_mesh()
    token_axes = _TOKEN_AXES.get()
    if token_axes and not mesh.empty and mesh.size > 1:
        return _routed_per_device(
            x, experts, weights, gate, up, down, token_axes=token_axes, activation=activation
        )
    return _local_outputs(x, experts, weights, gate, up, down, first=0, activation=activation)


def _routed_per_device(x, experts, weights, gate, up, down, *, token_axes, activation) -> Array:
    """`expert_outputs` of a program whose tokens are split over `token_axes` of the ambient
    mesh: one map over those axes (and `expert`), in which each device routes, sorts and
    computes its own tokens (left to XLA, the sort and the routed buffer were every device's
    tokens on every device: the expert MLPs computed once per device; experiments/LOG.md,
    session 34). Under an `expert` axis the trainer's tokens are split over it too: each device
    gathers its expert group's tokens, computes its E/ep experts' share of them, and a
    reduce-scatter over `expert` sums the shares back; the engine's tokens are the same on a
    replica's expert devices: each computes its experts' share and an all-reduce sums them. The
    stacks come in whole along every other axis (FSDP gathers them, as for a dense MLP)."""
    mesh = jax.sharding.get_abstract_mesh()
    ep = mesh.shape[EXPERT] if EXPERT in mesh.axis_names else 1
    gathered = ep > 1 and EXPERT in token_axes
    manual = set(token_axes) | ({EXPERT} if ep > 1 else set())

    def shard(x, experts, weights, gate, up, down):
        first = jax.lax.axis_index(EXPERT) * gate.shape[0] if ep > 1 else 0
        if gathered:
            gather = lambda v: jax.lax.all_gather(v, EXPERT, tiled=True)  # noqa: E731
            x, experts, weights = gather(x), gather(experts), gather(weights)
        out = _local_outputs(
            x, experts, weights, gate, up, down, first=first, activation=activation
        )
        if gathered:
            return jax.lax.psum_scatter(out, EXPERT, tiled=True)
        return jax.lax.psum(out, EXPERT) if ep > 1 else out

    tokens, stacks = PS(token_axes), PS(EXPERT) if ep > 1 else PS()
    return jax.shard_map(
        shard,
        mesh=mesh,
        in_specs=(tokens, tokens, tokens, stacks, stacks, stacks),
        out_specs=tokens,
        axis_names=manual,
        # the kernel of the stacks' gradient (`weight_gradient`) does not trace on values
        # typed as varying (jax 0.10.2); untyped, the map's transpose still sums the
        # gradient of an operand every device holds whole (the stacks along `fsdp`; tests)
        check_vma=False,
    )(x, experts, weights, gate, up, down)


def _local_outputs(x, experts, weights, gate, up, down, *, first, activation) -> Array:
    """The share of experts [first, first + len(gate)) of every routed pair: pairs routed to
    other experts sort past the last group (the grouped matmul leaves their rows zero) and
    weigh 0."""
    n, k = experts.shape
    local = gate.shape[0]
    ids = experts - first
    mine = (ids >= 0) & (ids < local)
    flat = jnp.where(mine, ids, local).reshape(-1)
    order = jnp.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
    token = order // k
    group_sizes = jnp.bincount(flat, length=local + 1)[:local].astype(jnp.int32)
    routed = x[token]  # [N*k, D]: the routed tokens' buffer
    hidden = activation(grouped_matmul(routed, gate, group_sizes))
    hidden = hidden * grouped_matmul(routed, up, group_sizes)
    out = grouped_matmul(hidden, down, group_sizes)  # [N*k, D]
    pair_weights = jnp.where(mine, weights, 0.0).reshape(-1)[order]
    out = out * pair_weights[:, None].astype(out.dtype)
    return jnp.zeros_like(x).at[token].add(out)


@jax.custom_vjp
def grouped_matmul(rows: Array, weights: Array, group_sizes: Array) -> Array:
    """rows [M, D] grouped by expert (group g: the group_sizes[g] rows after those of groups
    < g; rows past the last group give zeros) @ weights [G, D, F] -> [M, F]:
    `jax.lax.ragged_dot`, with its weight gradient grouped on TPU too. XLA-TPU (libtpu 0.0.42)
    runs ragged_dot and its row gradient as grouped products, but lowers the weight gradient
    (a ragged contraction) as one dense product of every row with every expert: G times the
    FLOPs (experiments/LOG.md, session 34). On TPU that gradient is megablox's `tgmm` (a
    Pallas kernel in JAX, the one MaxText's MoE trainer uses); elsewhere ragged_dot's own."""
    return jax.lax.ragged_dot(rows, weights, group_sizes)


def _grouped_forward(rows: Array, weights: Array, group_sizes: Array):
    return grouped_matmul(rows, weights, group_sizes), (rows, weights, group_sizes)


def _grouped_backward(residuals, grad: Array):
    rows, weights, group_sizes = residuals
    grad_rows = jax.lax.ragged_dot(grad, weights.swapaxes(1, 2), group_sizes)

    def xla(rows, grad, group_sizes):  # ragged_dot's own weight gradient
        _, pullback = jax.vjp(lambda w: jax.lax.ragged_dot(rows, w, group_sizes), weights)
        return pullback(grad)[0]

    def tpu(rows, grad, group_sizes):
        return weight_gradient(rows, grad, group_sizes, weights.shape[0]).astype(weights.dtype)

    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and 0 < len(mesh.manual_axes) < len(mesh.axis_names):
        # a map over some axes only (the engine's expert-parallel layer, `expert_outputs`):
        # the kernel cannot run with the others left to XLA, and no trainer differentiates it
        grad_weights = xla(rows, grad, group_sizes)
    else:
        grad_weights = jax.lax.platform_dependent(rows, grad, group_sizes, tpu=tpu, default=xla)
    return grad_rows.astype(rows.dtype), grad_weights.astype(weights.dtype), None


grouped_matmul.defvjp(_grouped_forward, _grouped_backward)

GMM_TILE_ROWS = 128  # megablox's row tile: rows are padded to a multiple of it


def weight_gradient(
    rows: Array, grad: Array, group_sizes: Array, groups: int, interpret: bool = False
) -> Array:
    """sum over group g's rows of rows^T grad -> [G, D, F] (float32), by megablox's `tgmm`.
    A Pallas kernel is not partitioned by XLA. Inside a map over every mesh axis (the trainer's
    layer, `_routed_per_device`) each device computes its own rows' share; under an ambient
    mesh with no map the rows are split over every device here (padded with zero rows, which
    add nothing) and an all-reduce adds the shares. Not inside a map over some axes only
    (`grouped_matmul` keeps ragged_dot's gradient there). `interpret`: Pallas' interpreter
    (the CPU tests)."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = () if mesh.empty else mesh.manual_axes
    if mesh.empty or mesh.size == 1 or len(manual) == len(mesh.axis_names):
        return _tgmm(rows, grad, group_sizes, groups, interpret)
    if manual:
        raise ValueError(f"weight_gradient in a map over {manual} of {mesh.axis_names} only")
    axes = tuple(mesh.axis_names)
    chunk = -(-rows.shape[0] // (mesh.size * GMM_TILE_ROWS)) * GMM_TILE_ROWS
    pad = ((0, mesh.size * chunk - rows.shape[0]), (0, 0))
    rows, grad = jnp.pad(rows, pad), jnp.pad(grad, pad)

    def share(rows, grad, group_sizes):  # this device's `chunk` rows
        start = jax.lax.axis_index(axes) * chunk
        ends = jnp.cumsum(group_sizes)
        mine = jnp.clip(ends - start, 0, chunk) - jnp.clip(ends - group_sizes - start, 0, chunk)
        return jax.lax.psum(_tgmm(rows, grad, mine, groups, interpret), axes)

    # check_vma=False: the kernel's group metadata (a histogram) does not trace on values
    # typed as varying (jax 0.10.2); this map is a gradient's and is never differentiated
    return jax.shard_map(
        share, mesh=mesh, in_specs=(PS(axes), PS(axes), PS()), out_specs=PS(), check_vma=False
    )(rows, grad, group_sizes)


def _tgmm(rows: Array, grad: Array, group_sizes: Array, groups: int, interpret: bool) -> Array:
    """One device's `weight_gradient`. The kernel's rows must be a multiple of its row tile:
    the padding and the rows past the last group form one more group, not computed."""
    from jax.experimental.pallas.ops.tpu.megablox.gmm import tgmm  # noqa: PLC0415  (Pallas)

    m = rows.shape[0]
    padded = -(-m // GMM_TILE_ROWS) * GMM_TILE_ROWS
    if padded > m:
        rows, grad = (jnp.pad(x, ((0, padded - m), (0, 0))) for x in (rows, grad))
    rest = jnp.asarray(padded, jnp.int32) - group_sizes.sum()
    sizes = jnp.concatenate([group_sizes.astype(jnp.int32), rest[None]])
    tiling = (GMM_TILE_ROWS, min(512, rows.shape[1]), min(512, grad.shape[1]))
    lhs = rows.swapaxes(0, 1)  # [D, M]
    return tgmm(lhs, grad, sizes, jnp.float32, tiling, None, groups, None, interpret)


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
