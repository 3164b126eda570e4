"""Micro-batches of packed rows with gradient accumulation (`trainer.micro_batch_rows`).

The paper makes one optimizer update per batch (Section I.1); when a batch's activations do not
fit, its rows run in micro-batches of `m` rows per device and their gradients are summed before
that one update. The loss is a sum of per-token terms over the whole batch divided by the whole
batch's normaliser (token_mean: every completion token of the batch; constant: sequences x
max_new_tokens), so summing the micro-batches' gradients gives the one-shot step's gradient.

How: (1) the decoder runs over every micro-batch without keeping residuals, giving the final
hidden states of all rows ([R, L, D]: linear in tokens); (2) the fused head (`trainer/head.py`)
runs once over the K loss positions and returns the loss and dLoss/dhidden; (3) each
micro-batch's decoder is run again under `jax.vjp` and pulled back with its share of
dLoss/dhidden. The cost is one extra forward of the decoder body (not of the output head) per
step; only one micro-batch's activations are alive at a time.

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


HiddenFn = Callable[[object, PackedRows], Array]  # (params, one micro-batch's rows) -> [M, L, D]


def hidden_in_micro_batches(hidden_fn: HiddenFn, params, rows: PackedRows, layout: MicroLayout):
    """Final hidden states [R, L, D] of every row, one micro-batch at a time (no residuals)."""
    if layout.count == 1:
        return hidden_fn(params, rows)
    split = jax.tree.map(layout.split, rows)  # each leaf [n, devices * m, L]
    return layout.join(jax.lax.map(lambda mb: hidden_fn(params, mb), split))


def accumulate_decoder_grads(
    hidden_fn: HiddenFn, params, rows: PackedRows, dhidden: Array, layout: MicroLayout
):
    """Sum over micro-batches of the decoder's vjp with its share of dLoss/dhidden [R, L, D]:
    the gradient of the loss by `params` through the decoder body (float32 sums)."""
    split = jax.tree.map(layout.split, rows)

    def add(total, xs):
        mb, cotangent = xs
        _, pull_back = jax.vjp(lambda p: hidden_fn(p, mb), params)
        (grads,) = pull_back(cotangent)
        return jax.tree.map(lambda a, g: a + g.astype(jnp.float32), total, grads), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    total, _ = jax.lax.scan(add, zeros, (split, layout.split(dhidden)))
    return total
