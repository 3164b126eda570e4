"""Micro-batches of packed rows with gradient accumulation (`trainer.micro_batch_rows`).

The paper makes one optimizer update per batch (Section I.1); when a batch's activations do not
fit, its rows run in micro-batches of `m` rows per device and their gradients are summed before
that one update. The loss is a sum of per-token terms over the whole batch divided by the whole
batch's normaliser (token_mean: every completion token of the batch; constant: sequences x
max_new_tokens), so summing the micro-batches' gradients gives the one-shot step's gradient.

How: each micro-batch's decoder runs forward under `jax.vjp` (its residuals alive), the fused
head (`trainer/head.py`) runs over that micro-batch's own loss slots (`group_slots`: on device,
at a static width and a traced chunk count, so no slot is computed twice and a chunk of padding
is never computed) and gives dLoss/dhidden, and the same vjp pulls it back. The decoder body runs
forward once per step, as in the one-shot step; only one micro-batch's activations, and one
head chunk's [C, V] logits beside them, are alive at a time. `hidden_in_micro_batches` is the
forward alone (log-probs, the KL reference).

Row layout: device d holds global rows [d * r, (d + 1) * r); micro-batch t takes rows
[t * m, (t + 1) * m) of every device's share, so a micro-batch stays sharded like the batch.
It owns the row layout and the accumulation; it knows nothing of the loss or the model.

Shapes: R global rows, r rows per device, m rows per device per micro-batch, n micro-batches,
L row tokens, D width.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from locoexp.trainer.packing import PackedRows

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class MicroLayout:
    """n micro-batches of m rows on each of `devices` devices, each holding r rows."""

    devices: int
    rows_per_device: int  # r
    micro_rows: int  # m
    count: int  # n

    @classmethod
    def of(cls, global_rows: int, devices: int, micro_batch_rows: int) -> "MicroLayout":
        """The layout of `global_rows` rows; micro_batch_rows 0 (or >= r) = one micro-batch."""
        r = global_rows // devices
        m = r if micro_batch_rows == 0 else min(micro_batch_rows, r)
        return cls(devices=devices, rows_per_device=r, micro_rows=m, count=-(-r // m))

    def split(self, x: Array) -> Array:
        """[R, ...] -> [n, devices * m, ...], padding each device's share to n * m rows with
        zeros (segment 0: padding rows attend to nothing and carry no loss)."""
        d, r, m, n = self.devices, self.rows_per_device, self.micro_rows, self.count
        x = x.reshape(d, r, *x.shape[1:])
        x = jnp.pad(x, [(0, 0), (0, n * m - r)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape(d, n, m, *x.shape[2:]).swapaxes(0, 1)
        return x.reshape(n, d * m, *x.shape[3:])

    def join(self, x: Array) -> Array:
        """[n, devices * m, ...] -> [R, ...] (inverse of `split`, padding rows dropped)."""
        d, r, m, n = self.devices, self.rows_per_device, self.micro_rows, self.count
        x = x.reshape(n, d, m, *x.shape[2:]).swapaxes(0, 1)
        return x.reshape(d, n * m, *x.shape[3:])[:, :r].reshape(d * r, *x.shape[3:])


# (params, one micro-batch's rows) -> (hidden [M, L, D], the router's load-balancing loss [])
HiddenFn = Callable[[object, PackedRows[Array]], tuple[Array, Array]]


def hidden_in_micro_batches(
    hidden_fn: HiddenFn, params, rows: PackedRows[Array], layout: MicroLayout
):
    """Final hidden states [R, L, D] of every row, one micro-batch at a time (no residuals)."""
    if layout.count == 1:
        return hidden_fn(params, rows)[0]
    split = jax.tree.map(layout.split, rows)  # each leaf [n, devices * m, L]
    return layout.join(jax.lax.map(lambda mb: hidden_fn(params, mb)[0], split))


def group_slots(
    layout: MicroLayout,
    row_tokens: int,
    loss_index: Array,
    fields: dict[str, Array],
    *,
    chunk: int,
) -> tuple[dict[str, Array], Array]:
    """Each micro-batch's own loss slots, so that its head runs inside its decoder's vjp.

    loss_index [K] indexes the global flat [R, L] rows; fields are per-slot arrays [K], one
    of them "mask" (slots with mask 0 are dropped). Returns the per-micro-batch groups, a dict
    with "index" [n, devices, S] into the micro-batch's flat [devices * m * L] hidden states and
    each field gathered likewise (lane d holds the slots of device d's rows, in order, padded
    with mask 0), and the group's chunk count [n]: whole chunks of `chunk` columns the fullest
    lane fills. S, a multiple of `chunk`, bounds any lane: min(m * L, K) rounded up."""
    d, r, m, n = layout.devices, layout.rows_per_device, layout.micro_rows, layout.count
    k, span = loss_index.shape[0], m * row_tokens  # a lane's m rows
    chunk = min(chunk, span, k)  # as the head's chunk over lanes of this width
    width = -(-min(span, k) // chunk) * chunk
    row, position = loss_index // row_tokens, loss_index % row_tokens
    device, within = row // r, row % r
    local = (within % m) * row_tokens + position  # in the device's m rows of the micro-batch
    group = (within // m) * d + device
    keys = jnp.where(fields["mask"] > 0, group * span + local, n * d * span)  # past: dropped
    source, counts = _slots_by_key(keys, n * d, span, width)
    filled = jnp.arange(width)[None, :] < counts[:, None]  # [n * d, S]
    lane_start = (jnp.arange(n * d) % d * span)[:, None]  # device d's rows in the micro-batch
    groups = {key: jnp.where(filled, x[source], 0).astype(x.dtype) for key, x in fields.items()}
    groups["index"] = jnp.where(filled, lane_start + local[source], 0)
    groups = jax.tree.map(lambda x: x.reshape(n, d, width), groups)
    chunks = -(-counts.reshape(n, d).max(axis=1) // chunk)
    return groups, chunks


def _slots_by_key(key: Array, groups: int, span: int, width: int) -> tuple[Array, Array]:
    """(source [groups, width]: the slots of group g in the order of their keys, 0 past its
    count; counts [groups]) for distinct keys g * span + position (a key past groups * span is
    dropped). No sort: the slots are written into a [groups * span] map at their keys, and
    the c-th slot of a group is found by binary search over the map's running count. An
    argsort of the K keys is what XLA-TPU would run on every device, and compile: 26 s for a
    million slots against 2.9 s for this on this CPU (experiments/LOG.md, session 31); this is
    a scatter of unique indices, a cumulative sum and `width` binary searches per group."""
    k = key.shape[0]
    slot_at = jnp.full((groups * span,), k, jnp.int32)
    slot_at = slot_at.at[key].set(jnp.arange(k, dtype=jnp.int32), mode="drop", unique_indices=True)
    slot_at = slot_at.reshape(groups, span)
    seen = jnp.cumsum(slot_at < k, axis=1, dtype=jnp.int32)  # [groups, span]: slots up to here
    counts = seen[:, -1]
    wanted = jnp.arange(1, width + 1, dtype=jnp.int32)
    at = jax.vmap(lambda running: jnp.searchsorted(running, wanted))(seen)  # [groups, width]
    source = jnp.take_along_axis(slot_at, jnp.minimum(at, span - 1), axis=1)
    return jnp.where(wanted[None, :] <= counts[:, None], source, 0), counts


# (hidden [M, L, D], one micro-batch's slot group, carry) -> (dhidden [M, L, D], carry, out)
HeadFn = Callable[[Array, object, object], tuple[Array, object, object]]


def accumulate_grads(
    hidden_fn: HiddenFn,
    params,
    rows: PackedRows[Array],
    layout: MicroLayout,
    groups,
    head_fn: HeadFn,
    carry,
    *,
    aux_weight: float = 0.0,
):
    """Sum over micro-batches of the decoder's gradient: each micro-batch runs forward under
    `jax.vjp`, `head_fn` turns its hidden states and its slot group (a pytree with leading
    axis n, e.g. `group_slots`) into their cotangent, and the same vjp pulls it back, so the
    decoder body runs forward once per step. The router's load-balancing loss of each
    micro-batch enters with weight `aux_weight` / n (the mean over micro-batches: a batch
    statistic cannot be split into micro-batch sums). Returns the float32 gradient sum,
    `head_fn`'s final carry and its per-micro-batch outputs and router losses stacked [n, ...]."""
    split = jax.tree.map(layout.split, rows)

    def add(state, xs):
        total, carry = state
        mb, group = xs
        (hidden, aux), pull_back = jax.vjp(lambda p: hidden_fn(p, mb), params)
        dhidden, carry, out = head_fn(hidden, group, carry)
        (grads,) = pull_back((dhidden, jnp.asarray(aux_weight / layout.count, aux.dtype)))
        total = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), total, grads)
        return (total, carry), (out, aux)

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    (total, carry), outs = jax.lax.scan(add, (zeros, carry), (split, groups))
    return total, carry, outs
