"""Decode attention over a paged KV cache in plain XLA (CPU and GPU), reading only live pages.

The pool and page table are laid out as JAX's ragged paged attention kernel reads them
(`jax.experimental.pallas.ops.tpu.ragged_paged_attention`): per layer a pool [N, page, 2E, h]
with keys at even and values at odd heads, a table [W, Q] of each slot's pages in token order
(locoexp/rollout/pages.py allocates them), and each slot's length. On TPU that kernel takes the
same arrays (locoexp/model/paged_kernel.py, chosen by the layer's `kernel`); this is the XLA
path beside it, which CPU and GPU run, and TPU for a layer the kernel cannot take.

One new token per slot (decode), already written into its page. The pages every slot holds
are laid end to end as (slot, page) pairs, and a loop with a dynamic trip count gathers a chunk
of pairs at a time and folds each page into its own slot's online softmax (flash decoding): the
work is the pages the slots hold, so a slot of 100 tokens beside one of 2,000 costs its own 7
pages, not the longest slot's 125 (a loop over page columns, every slot in step, cost the
latter); no slot reads a page it does not hold, and no [W, S] score row over a dense cache's
unused slots is formed. It owns the attention arithmetic and the new token's write into its page
(`attend_paged`, which the model's attention calls with a `PagedLayer` in place of a dense
cache): no allocation (locoexp/rollout/pages.py), no scheduling.

Shapes: W slots, N pages, `page` tokens a page, E cache heads, R = query heads / E, h head_dim,
Q = most pages a slot holds.
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from locoexp.model.paged_kernel import PagedKernel, ragged_decode_attention

Array = jax.Array
_MASKED = -1e30  # finite: a fully masked page leaves the running maximum where it was
CHUNK_PAGES = 64  # (slot, page) pairs a loop iteration visits (`paged_decode_attention`)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedLayer:
    """One layer's paged cache as a decode iteration's attention takes it (in place of the dense
    cache's [B, E, S, h] pair): the pool and where each slot's tokens are. The engine's pool has
    a leading replica axis, each data-parallel replica's slots (W / r consecutive rows) owning
    their replica's pages. `kernel` (static): attend with the TPU kernel on its mesh
    (locoexp/model/paged_kernel.py) where the layer's shapes allow, else (None) the XLA path."""

    pool: Array  # [r, N, page, 2E, h], or [N, page, 2E, h] for one replica
    table: Array  # [W, Q] int32: each slot's pages, ids within its replica's pool
    lengths: Array  # [W] int32: tokens of each slot after the new one (>= 1)
    page: Array  # [W] int32: the page the new token is written to (N: written nowhere)
    offset: Array  # [W] int32: its offset in that page
    kernel: PagedKernel | None = dataclasses.field(default=None, metadata=dict(static=True))


def write_token(pool: Array, page: Array, offset: Array, kv: Array) -> Array:
    """Each slot's new [2E, h] keys and values (kv [W, 2E, h]) at (page, offset) of its
    replica's pool; a page of N is dropped. Slots hold distinct pages, so no two writes meet."""
    if pool.ndim == 4:
        return pool.at[page, offset].set(kv.astype(pool.dtype), mode="drop")
    replicas = pool.shape[0]
    split = lambda x: x.reshape(replicas, -1, *x.shape[1:])  # noqa: E731
    write = lambda own, p, o, x: own.at[p, o].set(x.astype(own.dtype), mode="drop")  # noqa: E731
    return jax.vmap(write)(pool, split(page), split(offset), split(kv))


def attend_paged(
    q: Array, k: Array, v: Array, layer: PagedLayer, window: int = 0
) -> tuple[Array, PagedLayer]:
    """The decode iteration's attention over a paged cache, as `attend_cached` over a dense
    one: q [W, 1, H, h], k/v [W, 1, K, h] of each slot's new token -> [W, 1, H*h] and the layer
    with the new keys/values written into their pages. A pool of E > K heads holds each KV
    head E/K times (a tensor-parallel engine with more devices than KV heads)."""
    slots, _, heads, h = q.shape
    e = layer.pool.shape[-2] // 2
    if e != k.shape[2]:
        k, v = (jnp.repeat(x, e // k.shape[2], axis=2) for x in (k, v))
    kv = jnp.stack([k[:, 0], v[:, 0]], axis=2).reshape(slots, 2 * e, h)  # k at even heads
    pool = write_token(layer.pool, layer.page, layer.offset, kv)
    kernel = layer.kernel
    if kernel is not None and pool.ndim == 5 and not kernel.unusable(heads, e, h, pool.dtype):
        out = ragged_decode_attention(kernel, q[:, 0], pool, layer.table, layer.lengths, window)
    else:
        out = paged_decode_attention(q[:, 0], pool, layer.table, layer.lengths, window)
    return out[:, None], dataclasses.replace(layer, pool=pool)


def paged_decode_attention(
    q: Array, pool: Array, table: Array, lengths: Array, window: int = 0
) -> Array:
    """q [W, H, h] of each slot's newest token (position lengths - 1), pool [N, page, 2E, h]
    (or [r, N, page, 2E, h]: `PagedLayer`, each replica's slots over its own pool), table
    [W, Q] int32, lengths [W] int32 (>= 1: tokens in the slot, the new one included) ->
    [W, H*h]. With `window` > 0 a token attends only the `window` newest tokens (Gemma4's local
    layers, as `attend_cached`)."""
    if pool.ndim == 4:
        return _ragged_attention(q, pool, table, lengths, window)
    slots, replicas = q.shape[0], pool.shape[0]
    split = lambda x: x.reshape(replicas, slots // replicas, *x.shape[1:])  # noqa: E731
    one = functools.partial(_ragged_attention, window=window)
    return jax.vmap(one)(split(q), pool, split(table), split(lengths)).reshape(slots, -1)


def _ragged_attention(q: Array, pool: Array, table: Array, lengths: Array, window: int) -> Array:
    """`paged_decode_attention` over one pool [N, page, 2E, h]. The (slot, page) pairs every
    slot holds (its live pages, from the window's first to its last) are laid end to end in
    slot order and visited `CHUNK_PAGES` at a time, each pair's page against its own slot's
    query; the chunk's scores fold into each slot's online softmax by segment reductions over
    slots. Work follows the pages the slots hold, not slots x the longest slot."""
    slots, heads, h = q.shape
    page, e = pool.shape[-3], pool.shape[-2] // 2
    q = q.reshape(slots, e, heads // e, h) * jnp.asarray(h**-0.5, q.dtype)
    last = (lengths - 1) // page  # each slot's last page column
    first = jnp.maximum(lengths - window, 0) // page if window else jnp.zeros_like(lengths)
    ends = jnp.cumsum(last - first + 1)  # [W]: the pairs of slots 0..w
    segment = functools.partial(_segment, slots=slots)

    def visit(i, carry):
        top, total, acc = carry  # [W, E, R] x2, [W, E, R, h]
        pair = i * CHUNK_PAGES + jnp.arange(CHUNK_PAGES)  # [K]
        held = pair < ends[-1]
        slot = jnp.minimum(jnp.searchsorted(ends, pair, side="right"), slots - 1)  # [K]
        column = jnp.where(held, last[slot] - (ends[slot] - 1 - pair), last[slot])
        pages = pool[table[slot, column]].reshape(CHUNK_PAGES, page, e, 2, h)
        keys, values = pages[..., 0, :], pages[..., 1, :]  # [K, page, E, h]
        scores = jnp.einsum("kerh,kpeh->kerp", q[slot], keys, preferred_element_type=jnp.float32)
        position = column[:, None] * page + jnp.arange(page)[None, :]  # [K, page]
        live = held[:, None] & (position < lengths[slot][:, None])
        if window:
            live &= position >= lengths[slot][:, None] - window
        scores = jnp.where(live[:, None, None], scores, -jnp.inf)
        owner = jnp.where(held, slot, slots)  # a pair past the last is dropped by the segments
        new_top = jnp.maximum(top, segment(jax.ops.segment_max, scores.max(-1), owner))
        probs = jnp.exp(scores - new_top[slot][..., None])
        decay = jnp.exp(top - new_top)
        pv = jnp.einsum("kerp,kpeh->kerh", probs.astype(values.dtype), values)
        total = decay * total + segment(jax.ops.segment_sum, probs.sum(-1), owner)
        return new_top, total, acc * decay[..., None] + segment(jax.ops.segment_sum, pv, owner)

    rows = (slots, e, heads // e)
    init = (
        jnp.full(rows, _MASKED, jnp.float32),
        jnp.zeros(rows, jnp.float32),
        jnp.zeros((*rows, h), jnp.float32),
    )
    chunks = (ends[-1] + CHUNK_PAGES - 1) // CHUNK_PAGES
    _, total, acc = jax.lax.fori_loop(0, chunks, visit, init)
    return (acc / total[..., None]).astype(q.dtype).reshape(slots, heads * h)


def _segment(reduce: Callable, x: Array, owner: Array, *, slots: int) -> Array:
    """x [K, ...] of pairs in slot order reduced per slot -> [W, ...]; an owner of `slots` is
    dropped (a slot's NaN stays its own, as under a dense cache)."""
    return reduce(x, owner, num_segments=slots, indices_are_sorted=True)
