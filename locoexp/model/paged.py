"""Decode attention over a paged KV cache in plain XLA (CPU and GPU), reading only live pages.

The pool and page table are laid out as JAX's ragged paged attention kernel reads them
(`jax.experimental.pallas.ops.tpu.ragged_paged_attention`): per layer a pool [N, page, 2E, h]
with keys at even and values at odd heads, a table [W, Q] of each slot's pages in token order
(locoexp/rollout/pages.py allocates them), and each slot's length. On TPU that kernel takes the
same arrays (locoexp/model/paged_kernel.py, chosen by the layer's `kernel`); this is the XLA
path beside it, which CPU and GPU run, and TPU for a layer the kernel cannot take.

One new token per slot (decode), already written into its page. A loop over page columns, as
many as the longest slot holds (a dynamic trip count), gathers one page per slot and folds it
into an online softmax (flash decoding): no slot reads a page it does not hold (a slot past its
own pages re-reads its last page, masked), and no [W, S] score row over a dense cache's unused
slots is formed. It owns the attention arithmetic and the new token's write into its page
(`attend_paged`, which the model's attention calls with a `PagedLayer` in place of a dense
cache): no allocation (locoexp/rollout/pages.py), no scheduling.

Shapes: W slots, N pages, `page` tokens a page, E cache heads, R = query heads / E, h head_dim,
Q = most pages a slot holds.
"""

import dataclasses

import jax
import jax.numpy as jnp

from locoexp.model.paged_kernel import PagedKernel, ragged_decode_attention

Array = jax.Array
_MASKED = -1e30  # finite: a fully masked page leaves the running maximum where it was


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


def _per_replica_pages(pool: Array, ids: Array) -> Array:
    """pool[ids] for ids [W, ...] of slots grouped by replica: each replica's rows gather from
    its own pool (a batched gather over the replica axis, which the data axis splits, so no
    page crosses devices)."""
    if pool.ndim == 4:
        return pool[ids]
    replicas = pool.shape[0]
    by_replica = ids.reshape(replicas, -1, *ids.shape[1:])
    out = jax.vmap(lambda own, i: own[i])(pool, by_replica)
    return out.reshape(*ids.shape, *pool.shape[2:])


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
    (or [r, N, page, 2E, h]: `PagedLayer`), table [W, Q] int32, lengths [W] int32 (>= 1:
    tokens in the slot, the new one included) -> [W, H*h]. With `window` > 0 a token attends
    only the `window` newest tokens (Gemma4's local layers, as `attend_cached`)."""
    slots, heads, h = q.shape
    page, e = pool.shape[-3], pool.shape[-2] // 2
    q = q.reshape(slots, e, heads // e, h) * jnp.asarray(h**-0.5, q.dtype)
    last = (lengths - 1) // page  # each slot's last page column
    first = jnp.maximum(lengths - window, 0) // page if window else jnp.zeros_like(lengths)

    def visit(j, carry):
        top, total, acc = carry  # [W, E, R] x2, [W, E, R, h]
        column = jnp.clip(j, first, last)
        ids = jnp.take_along_axis(table, column[:, None], axis=1)[:, 0]
        block = _per_replica_pages(pool, ids).reshape(slots, page, e, 2, h)
        keys, values = block[..., 0, :], block[..., 1, :]  # [W, page, E, h]
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
