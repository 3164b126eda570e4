"""The JAX engine's device mesh and the layout of its weights and KV cache on it.

An engine over n devices is a (data, tensor) mesh of n / TP data-parallel replicas of TP devices
each (Section 2: DP x TP per engine). Consecutive devices form a TP group: a host's local
devices under `co`, consecutive hosts' devices on a single controller whose devices span hosts
(Table H1's TP16/TP32). Within a group, Megatron-style:
- q/k/v projections are split by output heads, o_proj by input heads (one all-reduce after it);
- gate/up by the MLP width, down_proj by its input (one all-reduce after it);
- the KV cache by its heads; with TP above the KV heads each device keeps the one KV head its
  query heads read (k/v projections replicated, the cache holding each KV head TP/K times),
  as vLLM does;
- embedding, output head and norms replicated.
Rows (sequences) are split over the data axis. XLA (GSPMD) partitions the programs from these
layouts; the engine compiles them with these shardings at their boundaries.

It owns layouts only: it never compiles, transfers or generates.
"""

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as PS

from locoexp.errors import require
from locoexp.model.config import ModelConfig

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


def cache_heads(model: ModelConfig, tensor_parallel: int) -> int:
    """Heads per layer of the engine's KV cache: the KV heads, or TP when TP exceeds them."""
    return max(model.num_kv_heads, tensor_parallel)


def engine_mesh(devices, tensor_parallel: int) -> Mesh:
    """(data, tensor) mesh over `devices`, TP consecutive devices per replica. Axes are Auto
    (XLA propagates the layouts below through the programs), named so explicitly because
    jax.make_mesh defaults to Explicit axes."""
    grid = np.array(devices).reshape(-1, tensor_parallel)
    return Mesh(grid, (DATA, TENSOR), axis_types=(AxisType.Auto, AxisType.Auto))


def param_spec(path: tuple, model: ModelConfig, tensor_parallel: int) -> PS:
    """PartitionSpec of the parameter at `path` (a key path of an nnx.State or a pure dict)."""
    names = {getattr(k, "key", getattr(k, "name", None)) for k in path}
    if tensor_parallel > model.num_kv_heads and names & {"k_proj", "v_proj"}:
        return PS()  # every device computes all KV heads and keeps the one it reads
    if names & set(_BY_OUTPUT) and "kernel" in names:
        return PS(None, TENSOR)
    if names & set(_BY_INPUT) and "kernel" in names:
        return PS(TENSOR, None)
    return PS()


def param_shardings(params, mesh: Mesh, model: ModelConfig, tensor_parallel: int):
    """A tree of NamedShardings matching `params` (an nnx.State or pure dict of the Params)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: NamedSharding(mesh, param_spec(path, model, tensor_parallel)), params
    )


def cache_sharding(mesh: Mesh) -> NamedSharding:
    """KV cache [C, S, E, h]: rows over data, heads over tensor."""
    return NamedSharding(mesh, PS(DATA, None, TENSOR, None))
