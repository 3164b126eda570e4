"""What crosses hosts in a colocated step, and nothing else (Section 2, "Rollout synchronization"):

- packed-shape agreement: hosts exchange their row counts and pad to the largest (Algorithm 1,
  line 4); with O1 the previous step's metrics ride on the same exchange instead of a barrier
  of their own;
- weight publication: the FSDP shards are all-gathered, then each host's replica is assembled
  from its own devices' buffers, with no host round trip (line 6);
- the metrics reduction (max and mean over hosts) that process 0 logs.

With one process every exchange is the identity, so the single-host path runs the same code.
"""

import dataclasses
import functools

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as PS

from locoexp.metrics.timing import reduce_over_hosts


@dataclasses.dataclass(frozen=True)
class HostGroup:
    """This process's place among the run's hosts."""

    index: int
    count: int

    @classmethod
    def current(cls) -> "HostGroup":
        return cls(index=jax.process_index(), count=jax.process_count())

    @property
    def is_leader(self) -> bool:
        return self.index == 0

    def allgather(self, values: np.ndarray) -> np.ndarray:
        """[n] float64 per host -> [H, n] on every host (one collective)."""
        values = np.asarray(values, np.float64)
        if self.count == 1:
            return values[None]
        return np.asarray(multihost_utils.process_allgather(values)).reshape(self.count, -1)


def exchange_rows(
    group: HostGroup, rows: int, *, carried: dict[str, float] | None
) -> tuple[int, list[dict[str, float]] | None]:
    """The packed-shape agreement: every host's row count -> the largest (Algorithm 1, line 4).
    O1 (Table B1): `carried`, this host's record of the previous step, rides on the same
    collective; every host's comes back (None when nothing was carried)."""
    values = carried or {}
    keys = sorted(values)
    gathered = group.allgather(np.array([rows, *(values[k] for k in keys)], np.float64))
    return int(gathered[:, 0].max()), None if carried is None else _records(keys, gathered[:, 1:])


def exchange_metrics(group: HostGroup, record: dict[str, float]) -> list[dict[str, float]]:
    """This host's record -> every host's, in a collective of its own (the barrier O1 avoids)."""
    keys = sorted(record)
    return _records(keys, group.allgather(np.array([record[k] for k in keys], np.float64)))


def _records(keys: list[str], rows: np.ndarray) -> list[dict[str, float]]:
    return [dict(zip(keys, row.tolist(), strict=True)) for row in rows]


@functools.cache
def replicator(mesh: Mesh, dtype):
    """The jitted gather of `replicate` (cached per mesh and dtype; the compile path lowers it)."""
    cast = (
        (lambda p: p) if dtype is None else (lambda p: jax.tree.map(lambda x: x.astype(dtype), p))
    )
    return jax.jit(cast, out_shardings=NamedSharding(mesh, PS()))


def replicate(params, mesh: Mesh, dtype=None):
    """All-gather sharded params into a full copy on every device of `mesh` (one program,
    compiled once per tree structure), cast to `dtype` first when given (the engine's: a bf16
    sampler of an fp32 trainer gathers half the bytes, Table I3)."""
    return replicator(mesh, dtype)(params)


def local_copy(array: jax.Array, devices: list[jax.Device]) -> jax.Array:
    """A replicated global array -> the same values on `devices` (this host's), reusing the
    buffers already on them (no device-to-host transfer)."""
    if array.is_fully_addressable:  # one process: the engine's load makes its own copy
        return array
    sharding = NamedSharding(Mesh(np.array(devices), ("data",)), PS())
    by_device = {shard.device: shard.data for shard in array.addressable_shards}
    return jax.make_array_from_single_device_arrays(
        array.shape, sharding, [by_device[d] for d in devices]
    )


def gather_for_engine(params, mesh: Mesh, devices: list[jax.Device], *, one_call: bool, dtype=None):
    """Trainer params (FSDP over `mesh`) -> a full replica in `dtype` (default: theirs) on this
    host's engine `devices`.

    O4 (Table B1): one gather program for every weight; otherwise one per layer and one per
    remaining top-level parameter group, as a per-layer publisher does."""
    if one_call:
        full = replicate(params, mesh, dtype)
    else:
        pure = nnx.to_pure_dict(params)
        gathered = {
            name: (
                {i: replicate(layer, mesh, dtype) for i, layer in sub.items()}
                if name == "layers"
                else replicate(sub, mesh, dtype)
            )
            for name, sub in pure.items()
        }
        full = jax.tree.map(lambda x: x, params)
        nnx.replace_by_pure_dict(full, gathered)
    return jax.tree.map(lambda x: local_copy(x, devices), full)


_SUMMED = ("rollout/sequences", "rollout/tokens_in", "rollout/tokens_out")
# Means over this host's sequences: weighted by each host's `rollout/sequences`, since under da
# the rollout hosts may hold floor or ceil of B/H groups (`phases.host_shares`).
_PER_SEQUENCE = (
    "rollout/reward_mean",
    "rollout/prompt_tokens_mean",
    "rollout/completion_tokens_mean",
    "rollout/truncated_share",
)


def combine_host_metrics(per_host: list[dict[str, float]]) -> dict[str, float]:
    """Per-host records -> one record: timings are the slowest host's (a synchronous step
    waits for it) with `_mean` beside them; counts add up; per-sequence means are weighted by
    each host's sequences; other fields are means over hosts, or maxima for `_max` keys."""
    if len(per_host) == 1:
        return dict(per_host[0])
    reduced = reduce_over_hosts(per_host)
    record = {}
    for key in per_host[0]:
        if key.startswith("timing/"):
            record[key] = reduced[f"{key}_max"]
            record[f"{key}_mean"] = reduced[f"{key}_mean"]
        elif key in _SUMMED:
            record[key] = reduced[f"{key}_mean"] * len(per_host)
        elif key in _PER_SEQUENCE and "rollout/sequences" in per_host[0]:
            weights = [float(r["rollout/sequences"]) for r in per_host]
            values = [float(r[key]) for r in per_host]
            record[key] = float(np.average(values, weights=weights))
        elif key.endswith("_max"):
            record[key] = reduced[f"{key}_max"]
        else:
            record[key] = reduced[f"{key}_mean"]
    return record
