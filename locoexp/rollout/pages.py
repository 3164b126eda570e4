"""The page allocator of a paged KV cache (issue 42): a pool of fixed-size pages per engine
replica, a page table per slot, pages taken as a row grows and given back when it ends.

Everything is device arrays and pure functions with static shapes, so the allocator runs inside
the engine's decode loop (`lax.while_loop`) with no host round trip: `grow` before a decode
iteration (or a refill's prefill) gives each slot the pages its next tokens need, `release`
returns the pages of the slots whose requests ended, and a refill takes freed pages. The page
table is laid out as JAX's ragged paged attention kernel reads it
(`jax.experimental.pallas.ops.tpu.ragged_paged_attention`: `page_indices` [max_num_seqs,
pages_per_seq] int32, a row's tokens at positions 0.. in its pages in table order), so the TPU
kernel and an XLA path can share it.

When the pool runs dry, slots are served in slot order and a slot that cannot get its pages is
not granted any (`Pages.granted` is False): the rule is to wait, as the slot's request keeps its
pages and does not advance this iteration; the pages come back when other requests end. When
no live slot can go on, waiting would never end: `preempt` takes the last live slot's pages
back and its request starts over (recompute), as vLLM preempts on a full cache. A pool
that cannot hold even one row at its caps can never serve it; `pages_for` lets the caller refuse
that at start-up.

It owns the bookkeeping only: no cache arrays, no attention, no scheduling (the engine's use
of it is locoexp/rollout/paged_slots.py, `rollout.kv_cache=paged`).

Shapes: W slots, Q = most pages a slot can hold (`pages_for(P + M, page_tokens)`), N pages in the
pool.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


def pages_for(tokens, page_tokens: int):
    """Pages that hold `tokens` tokens (an int or an int array)."""
    return -(-tokens // page_tokens)


class Pages(NamedTuple):
    """A replica's pool and its slots' page tables. Free pages are `free[:top]` (a stack)."""

    free: Array  # [N] int32: page ids, the first `top` of them free
    top: Array  # int32: free pages
    table: Array  # [W, Q] int32: slot i's pages in token order, N past its `held`
    held: Array  # [W] int32: pages slot i holds
    granted: Array  # [W] bool: the last `grow` gave slot i every page it asked for


def empty_pages(pages: int, slots: int, pages_per_slot: int) -> Pages:
    """Every page free, no slot holding one."""
    return Pages(
        free=jnp.arange(pages, dtype=jnp.int32),
        top=jnp.int32(pages),
        table=jnp.full((slots, pages_per_slot), pages, jnp.int32),
        held=jnp.zeros((slots,), jnp.int32),
        granted=jnp.ones((slots,), bool),
    )


def grow(p: Pages, tokens: Array, *, page_tokens: int) -> Pages:
    """Give each slot the pages that hold `tokens` [W] tokens (its length after the next write;
    0 asks for nothing). Slots are served in slot order while the pool lasts: a slot whose
    pages do not fit gets none, nor does any later slot that asks for pages (`granted` False:
    it waits; no slot overtakes a waiting one)."""
    slots, per_slot = p.table.shape
    want = jnp.maximum(pages_for(tokens, page_tokens) - p.held, 0)
    upto = jnp.cumsum(want)
    take = jnp.where(upto <= p.top, want, 0)
    granted = (upto <= p.top) | (want == 0)  # a slot whose next tokens fit its pages goes on
    start = upto - take  # pages taken by the slots before this one
    column = jnp.arange(per_slot)[None, :]
    k = column - p.held[:, None]  # this slot's k-th new page goes at column held + k
    new = (k >= 0) & (k < take[:, None])
    # popped from the top of the stack: slot i's k-th page is free[top - 1 - (start_i + k)]
    source = jnp.clip(p.top - 1 - (start[:, None] + k), 0, p.free.shape[0] - 1)
    table = jnp.where(new, p.free[source], p.table)
    return p._replace(
        top=p.top - take.sum(dtype=jnp.int32), table=table, held=p.held + take, granted=granted
    )


def release(p: Pages, ended: Array) -> Pages:
    """Return the pages of the slots where `ended` [W] is True to the pool; their tables empty."""
    slots, per_slot = p.table.shape
    count = jnp.where(ended, p.held, 0)
    start = jnp.cumsum(count) - count
    column = jnp.arange(per_slot)[None, :]
    back = column < count[:, None]
    position = jnp.where(back, p.top + start[:, None] + column, p.free.shape[0])  # N: dropped
    free = p.free.at[position].set(p.table, mode="drop")
    return p._replace(
        free=free,
        top=p.top + count.sum(dtype=jnp.int32),
        table=jnp.where(ended[:, None], p.free.shape[0], p.table),
        held=jnp.where(ended, 0, p.held),
    )


def preempt(p: Pages, live: Array) -> tuple[Pages, Array]:
    """The dry pool's way out when waiting alone would deadlock: if no live slot (`live` [W])
    could go on after `grow`, the last live slot holding pages gives them all back and its
    request starts over (recompute, vLLM's preemption mode for a full cache); otherwise
    nothing changes. Returns the pages and the preempted slot as a [W] mask. Repeated, it frees
    pages until the first waiting slot fits, which it does whenever one row at its caps fits the
    pool (`pages_for`: the start-up check)."""
    stuck = live.any() & ~(p.granted & live).any()
    holders = live & (p.held > 0)
    last = holders.shape[0] - 1 - jnp.argmax(holders[::-1])
    victim = stuck & holders.any() & (jnp.arange(holders.shape[0]) == last)
    return release(p, victim), victim


def slot_of_token(p: Pages, position: Array, *, page_tokens: int) -> tuple[Array, Array]:
    """Where token `position` [W] of each slot lives: (page [W], offset in the page [W]); the
    page is N (no page) where the slot does not hold that position."""
    column = jnp.minimum(position // page_tokens, p.table.shape[1] - 1)
    page = jnp.take_along_axis(p.table, column[:, None], axis=1)[:, 0]
    held = position < p.held * page_tokens
    return jnp.where(held, page, p.free.shape[0]), position % page_tokens
