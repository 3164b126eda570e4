"""The JAX engine's device mesh and the layout of its weights and KV cache on it.

An engine over n devices is a (data, tensor) mesh of n / TP data-parallel replicas of TP devices
each (Section 2: DP x TP per engine). Consecutive devices form a TP group: a host's local
devices under `co`, consecutive hosts' devices on a single controller whose devices span hosts
(Table H1's TP16/TP32). Within a group, Megatron-style:
- q/k/v projections are split by output heads, o_proj by input heads (one all-reduce after it);
- gate/up by the MLP width, down_proj by its input (one all-reduce after it);
- the KV cache by its heads (a paged cache's pool also by replica: `pool_sharding`); with TP
  above the KV heads each device keeps the one KV head its query heads read (k/v projections
  replicated, the cache holding each KV head TP/K times), as vLLM does;
- embedding and output head split by vocabulary when TP divides it (a vocabulary-parallel head,
  as vLLM's and tpu-inference's: each device computes the logits of its V / TP tokens, and the
  sampler keeps to those shards, locoexp/rollout/sampling.py; the embedding lookup becomes a
  local lookup and one [rows, D] all-reduce), replicated otherwise; norms replicated.
A mixture-of-experts model's engine may also split its experts: each replica is then an
(expert, tensor) grid of EP x TP devices (`rollout.expert_parallel`), the [E, ...] expert stacks
split along E over `expert` (replicated over `tensor`), everything else laid out as above and
replicated over `expert`; the routed tokens meet their experts by one all-reduce over `expert`
per MoE layer (locoexp/model/moe.py). Rows (sequences) are split over the data axis.
XLA (GSPMD) partitions the programs from these layouts; the engine compiles them with these
shardings at their boundaries.  It owns layouts only: it never compiles, transfers or generates.
"""

import math

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as PS

from locoexp.errors import require
from locoexp.model.config import ModelConfig
from locoexp.model.moe import EXPERT, is_expert_stack

DATA, TENSOR = "data", "tensor"

_BY_OUTPUT = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # kernels [D, X]: split X
_BY_INPUT = ("o_proj", "down_proj")  # kernels [X, D]: split X


def check_tensor_parallel(model: ModelConfig, tensor_parallel: int, devices: int) -> None:
    """Refuse a TP degree the heads, the KV heads or the engine's devices cannot take."""
    t, heads, kv = tensor_parallel, model.num_heads, model.num_kv_heads
    require(
        heads % t == 0 and devices % t == 0 and (kv % t == 0 if t <= kv else t % kv == 0),
        f"rollout.tensor_parallel={t} must divide model.num_heads={heads} and the engine's "
        f"{devices} devices, and divide (or be a multiple of) model.num_kv_heads={kv}.",
    )


def resolve_expert_parallel(model: ModelConfig, expert_parallel: int, replica_devices: int) -> int:
    """The engine's EP degree: `rollout.expert_parallel`, or with 0 the most that divide both
    the experts and the `replica_devices` (the engine's devices / TP); 1 for a dense model."""
    if not model.moe:
        return 1
    return expert_parallel or math.gcd(model.num_experts, replica_devices)


def check_expert_parallel(model: ModelConfig, key: str, ep: int, devices: int) -> None:
    """Refuse an EP degree (config key `key`) the experts or the `devices` cannot take."""
    require(
        ep == 1 or model.moe,
        f"{key}={ep} needs a mixture-of-experts model: model={model.name} has no experts (use 1).",
    )
    valid = [e for e in range(1, devices + 1) if model.num_experts % e == 0 and devices % e == 0]
    require(
        not model.moe or ep in valid,
        f"{key}={ep} must divide model.num_experts={model.num_experts} and the {devices} "
        f"devices it splits the experts over: valid degrees are {', '.join(map(str, valid))}.",
    )


def cache_heads(model: ModelConfig, tensor_parallel: int) -> int:
    """Heads per layer of the engine's KV cache: the KV heads, or TP when TP exceeds them."""
    return max(model.num_kv_heads, tensor_parallel)


def engine_mesh(devices, tensor_parallel: int, expert_parallel: int = 1) -> Mesh:
    """(data, tensor) mesh over `devices`, TP consecutive devices per replica; with EP > 1
    (data, expert, tensor), EP x TP consecutive devices per replica. Axes are Auto (XLA
    propagates the layouts below through the programs), named so explicitly because
    jax.make_mesh defaults to Explicit axes."""
    if expert_parallel == 1:
        grid = np.array(devices).reshape(-1, tensor_parallel)
        return Mesh(grid, (DATA, TENSOR), axis_types=(AxisType.Auto,) * 2)
    expert_grid = np.array(devices).reshape(-1, expert_parallel, tensor_parallel)
    return Mesh(expert_grid, (DATA, EXPERT, TENSOR), axis_types=(AxisType.Auto,) * 3)


def vocab_shards(model: ModelConfig, tensor_parallel: int) -> int:
    """Devices the embedding, output head and logits are split over by vocabulary: TP when it
    divides the vocabulary, else 1 (replicated)."""
    return tensor_parallel if model.vocab_size % tensor_parallel == 0 else 1


def param_spec(path: tuple, model: ModelConfig, tensor_parallel: int, experts: bool = False) -> PS:
    """PartitionSpec of the parameter at `path` (a key path of an nnx.State or a pure dict);
    with `experts` (an expert axis) the [E, ...] stacks split along E."""
    if is_expert_stack(path):
        return PS(EXPERT) if experts else PS()
    names = {getattr(k, "key", getattr(k, "name", None)) for k in path}
    if tensor_parallel > model.num_kv_heads and names & {"k_proj", "v_proj"}:
        return PS()  # every device computes all KV heads and keeps the one it reads
    if vocab_shards(model, tensor_parallel) > 1:
        if "embed" in names and "embedding" in names:
            return PS(TENSOR, None)  # [V, D], also the tied output head
        if "lm_head" in names and "kernel" in names:
            return PS(None, TENSOR)  # [D, V]
    if names & set(_BY_OUTPUT) and "kernel" in names:
        return PS(None, TENSOR)
    if names & set(_BY_INPUT) and "kernel" in names:
        return PS(TENSOR, None)
    return PS()


def param_shardings(params, mesh: Mesh, model: ModelConfig, tensor_parallel: int):
    """A tree of NamedShardings matching `params` (an nnx.State or pure dict of the Params)."""
    experts = EXPERT in mesh.axis_names
    return jax.tree_util.tree_map_with_path(
        lambda path, _: NamedSharding(mesh, param_spec(path, model, tensor_parallel, experts)),
        params,
    )


def cache_sharding(mesh: Mesh) -> NamedSharding:
    """KV cache [C, E, S, h]: rows over data, heads over tensor."""
    return NamedSharding(mesh, PS(DATA, TENSOR, None, None))


def pool_sharding(mesh: Mesh) -> NamedSharding:
    """A paged KV cache's pool [r, N, page, 2E, h] (locoexp/rollout/paged_slots.py): each
    replica's pool on its own devices, the heads (k and v of each) over tensor."""
    return NamedSharding(mesh, PS(DATA, None, None, TENSOR, None))
