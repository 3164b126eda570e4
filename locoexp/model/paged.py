"""Decode attention over a paged KV cache in plain XLA (CPU and GPU), reading only live pages.

The pool and page table are laid out as JAX's ragged paged attention kernel reads them
(`jax.experimental.pallas.ops.tpu.ragged_paged_attention`): per layer a pool [N, page, 2E, h]
with keys at even and values at odd heads, a table [W, Q] of each slot's pages in token order
(locoexp/rollout/pages.py allocates them), and each slot's length. On TPU that kernel would take
the same arrays; this is the XLA path beside it.

One new token per slot (decode), already written into its page. A loop over page columns, as
many as the longest slot holds (a dynamic trip count), gathers one page per slot and folds it
into an online softmax (flash decoding): no slot reads a page it does not hold (a slot past its
own pages re-reads its last page, masked), and no [W, S] score row over a dense cache's unused
slots is formed. It owns the attention arithmetic only: no allocation, no writes.

Shapes: W slots, N pages, `page` tokens a page, E cache heads, R = query heads / E, h head_dim,
Q = most pages a slot holds.
"""

import jax
import jax.numpy as jnp

Array = jax.Array
_MASKED = -1e30  # finite: a fully masked page leaves the running maximum where it was


def paged_decode_attention(
    q: Array, pool: Array, table: Array, lengths: Array, window: int = 0
) -> Array:
    """q [W, H, h] of each slot's newest token (position lengths - 1), pool [N, page, 2E, h],
    table [W, Q] int32, lengths [W] int32 (>= 1: tokens in the slot, the new one included) ->
    [W, H*h]. With `window` > 0 a token attends only the `window` newest tokens (Gemma4's
    local layers, as `attend_cached`)."""
    slots, heads, h = q.shape
    page, e = pool.shape[1], pool.shape[2] // 2
    q = q.reshape(slots, e, heads // e, h) * jnp.asarray(h**-0.5, q.dtype)
    last = (lengths - 1) // page  # each slot's last page column
    first = jnp.maximum(lengths - window, 0) // page if window else jnp.zeros_like(lengths)

    def visit(j, carry):
        top, total, acc = carry  # [W, E, R] x2, [W, E, R, h]
        column = jnp.clip(j, first, last)
        block = pool[jnp.take_along_axis(table, column[:, None], axis=1)[:, 0]]
        keys, values = block[:, :, 0::2], block[:, :, 1::2]  # [W, page, E, h]
        scores = jnp.einsum("werh,wpeh->werp", q, keys, preferred_element_type=jnp.float32)
        position = j * page + jnp.arange(page)[None, :]  # [W, page]
        live = (position < lengths[:, None]) & (j >= first)[:, None] & (j <= last)[:, None]
        if window:
            live &= position >= lengths[:, None] - window
        scores = jnp.where(live[:, None, None], scores, -jnp.inf)
        new_top = jnp.maximum(top, scores.max(-1))
        probs = jnp.exp(scores - new_top[..., None])
        decay = jnp.exp(top - new_top)
        pv = jnp.einsum("werp,wpeh->werh", probs.astype(values.dtype), values)
        return new_top, decay * total + probs.sum(-1), acc * decay[..., None] + pv

    rows = (slots, e, heads // e)
    init = (
        jnp.full(rows, _MASKED, jnp.float32),
        jnp.zeros(rows, jnp.float32),
        jnp.zeros((*rows, h), jnp.float32),
    )
    _, total, acc = jax.lax.fori_loop(first.min(), last.max() + 1, visit, init)
    return (acc / total[..., None]).astype(q.dtype).reshape(slots, heads * h)
