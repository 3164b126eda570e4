"""The paged KV cache's part of the engine's slot programs (`rollout.kv_cache=paged`, issue 42).

The slots' cache is a `PagedCache`: per layer a pool of pages per data-parallel replica in ragged
paged attention's layout ([r, N, page, 2E, h], keys at even heads), and the allocator's state
(locoexp/rollout/pages.py): each replica's free pages and each slot's page table. A row's
tokens sit at positions 0.. of its pages (its prompt is not left-padded there); a decode
iteration attends over its own pages only (locoexp/model/paged.py; on TPU JAX's ragged paged
attention kernel, locoexp/model/paged_kernel.py).

The programs of locoexp/rollout/decode.py call this module at four points:
- a prefill (`start`'s first rows, a refill's row) is computed dense over the padded prompt as
  the dense cache's, and its real tokens copied into pages the row takes (`write_prompts`);
- before each decode iteration every running slot takes the page its next token needs
  (`make_room`). The pool-dry rule is vLLM's: slots are served in slot order and a slot whose
  page is not there waits (its request keeps its pages and does not advance); when every
  running slot waits, the last one holding pages is preempted: its pages go back and its
  request starts over from its prompt (recomputed: a request's draws depend on its id and
  token index only, so it regenerates the same tokens). A preempted slot is `parked` (its
  request kept, no pages) until a refill round re-prefills it;
- a refill round (`choose_refill`) re-prefills a replica's parked slot first, else takes the
  next waiting request into an empty slot, and only while no running slot of that replica
  waits for pages and the prompt's pages are free (running rows come before new ones);
- a request that ends gives its pages back (`release_ended`); a compaction moves table rows,
  never pages (`compact`).
Every allocator call runs per replica (a vmap over the leading replica axis, which the data
axis splits), so no page or table row crosses devices.

It owns the paged cache's bookkeeping in the programs: no sampling, no scheduling, no model.

Shapes: r replicas, W slots (W / r per replica), N pages per replica, Q = pages of a row at the
caps, P padded prompt length, E cache heads, h head_dim.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from locoexp.model.config import ModelConfig
from locoexp.model.paged import PagedLayer
from locoexp.model.paged_kernel import PagedKernel
from locoexp.rollout import pages as pg

Array = jax.Array
KVCache = tuple[tuple[Array, Array], ...]


@dataclasses.dataclass(frozen=True)
class PageLayout:
    """A paged engine's static settings: `page_tokens` per page and `pages` per replica's pool
    (None: enough for every slot at its caps, the dense cache's memory)."""

    page_tokens: int
    pages: int | None = None

    def pool_pages(self, slots_per_replica: int, row_tokens: int) -> int:
        """Pages in each replica's pool for `slots_per_replica` slots of rows of `row_tokens`
        tokens at most (P' + M)."""
        return self.pages or slots_per_replica * pg.pages_for(row_tokens, self.page_tokens)


class PagedCache(NamedTuple):
    """The slots' paged cache. `pages.free` [r, N] and `pages.top` [r] are per replica; the
    table [W, Q], `held` and `granted` [W] are per slot (replica j's slots are rows j*W/r..)."""

    pools: tuple[Array, ...]  # per layer [r, N, page, 2E, h]
    pages: pg.Pages
    parked: Array  # [W] bool: preempted, its request kept, waiting to be re-prefilled


def empty_cache(
    config: ModelConfig,
    layout: PageLayout,
    *,
    replicas: int,
    width: int,
    row_tokens: int,
    heads: int,
    dtype: jnp.dtype,
) -> PagedCache:
    """Zeroed pools of `layout.pool_pages` pages per replica, every page free, no slot parked."""
    pages = layout.pool_pages(width // replicas, row_tokens)
    per_slot = pg.pages_for(row_tokens, layout.page_tokens)

    def pool(i: int) -> Array:
        kv_heads, head_dim = config.layer_kv_shape(i)
        e = max(heads, kv_heads)
        return jnp.zeros((replicas, pages, layout.page_tokens, 2 * e, head_dim), dtype)

    one = pg.empty_pages(pages, width // replicas, per_slot)
    return PagedCache(
        pools=tuple(pool(i) for i in range(config.num_layers)),
        pages=pg.Pages(
            free=jnp.broadcast_to(one.free, (replicas, pages)),
            top=jnp.full((replicas,), pages, jnp.int32),
            table=jnp.full((width, per_slot), pages, jnp.int32),
            held=jnp.zeros((width,), jnp.int32),
            granted=jnp.ones((width,), bool),
        ),
        parked=jnp.zeros((width,), bool),
    )


def _split(x: Array, replicas: int) -> Array:
    return x.reshape(replicas, x.shape[0] // replicas, *x.shape[1:])


def _merge(x: Array) -> Array:
    return x.reshape(-1, *x.shape[2:])


def _on_replicas(fn: Callable, p: pg.Pages, *rows: Array, replicas: int) -> Any:
    """`fn(pages, *rows)` on each replica's pool and slots; Pages and [W]-row results come back
    with their slot axes flat again."""
    nested = p._replace(
        table=_split(p.table, replicas),
        held=_split(p.held, replicas),
        granted=_split(p.granted, replicas),
    )
    out = jax.vmap(fn)(nested, *(_split(x, replicas) for x in rows))

    def flat(x: pg.Pages | Array) -> pg.Pages | Array:
        if isinstance(x, pg.Pages):
            return x._replace(table=_merge(x.table), held=_merge(x.held), granted=_merge(x.granted))
        return _merge(x)

    if isinstance(out, pg.Pages):
        return flat(out)
    return tuple(flat(x) for x in out)


def _grow(p: pg.Pages, tokens: Array, *, replicas: int, page_tokens: int) -> pg.Pages:
    grow = functools.partial(pg.grow, page_tokens=page_tokens)
    return _on_replicas(grow, p, tokens, replicas=replicas)


def _preempt(p: pg.Pages, live: Array, *, replicas: int) -> tuple[pg.Pages, Array]:
    return _on_replicas(pg.preempt, p, live, replicas=replicas)


def _release(p: pg.Pages, ended: Array, *, replicas: int) -> pg.Pages:
    return _on_replicas(pg.release, p, ended, replicas=replicas)


def write_prompts(
    c: PagedCache,
    prefilled: KVCache,
    local: Array,
    lens: Array,
    *,
    replicas: int,
    page_tokens: int,
) -> tuple[PagedCache, Array]:
    """Give slots `local` [r, n] (local indices in their replica; out of range: none) the pages
    of their prompts of `lens` [r, n] tokens, in slot order while the pool lasts, and copy the
    prompts' keys and values from `prefilled` (per layer [r*n, E, P, h], left-padded, rows
    grouped by replica) into them. Returns the cache and which slots got their pages [W]; the
    other slots' `granted` (the last decode iteration's waits) are left as they were."""
    per_replica = c.parked.shape[0] // replicas
    want = jax.vmap(lambda i, n: jnp.zeros(per_replica, jnp.int32).at[i].set(n, mode="drop"))(
        local, lens
    )
    pages = _grow(c.pages, _merge(want), replicas=replicas, page_tokens=page_tokens)
    table = _split(pages.table, replicas)
    pools = tuple(
        _write_layer(pool, table, k, v, local, lens, page_tokens)
        for pool, (k, v) in zip(c.pools, prefilled, strict=True)
    )
    got = pages.granted & (_merge(want) > 0)
    return c._replace(pools=pools, pages=pages._replace(granted=c.pages.granted)), got


def _write_layer(
    pool: Array, table: Array, k: Array, v: Array, local: Array, lens: Array, page_tokens: int
) -> Array:
    """One layer's prompt keys/values (k, v [r*n, E, P, h], left-padded) into the pages each
    slot holds (table [r, W/r, Q]): token t of a prompt of length l sits at its slot P - l + t
    in the dense rows and at position t in its pages. A slot without pages writes nothing."""
    replicas, pages = pool.shape[0], pool.shape[1]
    rows, e, prompt_len, h = k.shape
    columns = pg.pages_for(prompt_len, page_tokens)
    kv = jnp.stack([k, v], axis=2).transpose(0, 3, 1, 2, 4).reshape(rows, prompt_len, 2 * e, h)
    kv = _split(kv, replicas)

    # one replica: pool [N, page, 2E, h], table [W/r, Q], kv [n, P, 2E, h], local/lens [n]
    def one(pool: Array, table: Array, kv: Array, local: Array, lens: Array) -> Array:
        t = jnp.arange(columns * page_tokens)
        source = jnp.clip(prompt_len - lens[:, None] + t[None, :], 0, prompt_len - 1)
        data = jnp.take_along_axis(kv, source[:, :, None, None], axis=1)
        data = data.reshape(-1, columns, page_tokens, 2 * e, h)
        held = table[jnp.minimum(local, table.shape[0] - 1), :columns]  # [n, columns]
        mine = (local < table.shape[0])[:, None] & (
            jnp.arange(columns)[None, :] < pg.pages_for(lens, page_tokens)[:, None]
        )
        return pool.at[jnp.where(mine, held, pages)].set(data.astype(pool.dtype), mode="drop")

    return jax.vmap(one)(pool, table, kv, local, lens)


def make_room(
    c: PagedCache, *, running: Array, tokens: Array, replicas: int, page_tokens: int
) -> tuple[PagedCache, Array, Array]:
    """Before a decode iteration: every `running` slot [W] takes the pages that hold `tokens`
    [W] (its tokens after this iteration's write), the rest wait; if all wait, the last holder
    is preempted (parked). Returns the cache, the slots that decode this iteration [W] and the
    preempted slot [W]."""
    pages = _grow(
        c.pages, jnp.where(running, tokens, 0), replicas=replicas, page_tokens=page_tokens
    )
    pages, victim = _preempt(pages, running, replicas=replicas)
    go = running & pages.granted & ~victim
    return c._replace(pages=pages, parked=c.parked | victim), go, victim


def layers(
    c: PagedCache, *, position: Array, write: Array, replicas: int, page_tokens: int,
    kernel: PagedKernel | None = None,
) -> tuple[PagedLayer, ...]:  # fmt: skip
    """Each layer's `PagedLayer` for a decode iteration whose token sits at `position` [W]:
    written where `write` [W], attending over positions 0..position. A slot that writes
    nothing (empty, waiting for a page, or pending: its output is dropped) attends over one
    token, so neither attention path reads the pages of a row that does not decode. `kernel`:
    the TPU kernel's mesh (`paged_kernel.paged_kernel_for`), None for the XLA path."""
    slot_of = functools.partial(pg.slot_of_token, page_tokens=page_tokens)
    page, offset = _on_replicas(slot_of, c.pages, position, replicas=replicas)  # [W] each
    page = jnp.where(write, page, c.pages.free.shape[1])
    lengths = jnp.where(write, jnp.maximum(position + 1, 1), 1)
    return tuple(
        PagedLayer(
            pool=pool,
            table=c.pages.table,
            lengths=lengths,
            page=page,
            offset=offset,
            kernel=kernel,
        )  # fmt: skip
        for pool in c.pools
    )


def release_ended(c: PagedCache, ended: Array, *, replicas: int) -> PagedCache:
    """The pages of the slots whose requests ended (`ended` [W]) back to their pools."""
    return c._replace(pages=_release(c.pages, ended, replicas=replicas))


def choose_refill(
    c: PagedCache, request: Array, waiting: Array, prompt_lens: Array, *, replicas: int,
    page_tokens: int,
) -> tuple[Array, Array, Array, Array]:  # fmt: skip
    """One refill round: per replica [r], whether it takes a request, into which of its slots
    (local index, out of range when not), which request (R when none) and whether that request
    is a waiting one (not its parked slot's own). A replica re-prefills its first parked slot
    first, else takes the next waiting request (replicas in order) into its first empty slot;
    never while one of its running slots waits for pages, nor before the prompt's pages are
    free. `request` [W] by slot, `prompt_lens` [R]: each request's prompt tokens."""
    total = prompt_lens.shape[0]
    per_replica = request.shape[0] // replicas
    empty = _split(request == total, replicas)
    parked = _split(c.parked, replicas)
    waits = _split((request < total) & ~c.parked & ~c.pages.granted, replicas).any(axis=1)
    has_parked = parked.any(axis=1)
    local = jnp.where(has_parked, jnp.argmax(parked, axis=1), jnp.argmax(empty, axis=1))
    own = jnp.take_along_axis(_split(request, replicas), local[:, None], axis=1)[:, 0]
    top = c.pages.top

    def fits(r: Array) -> Array:  # [r]: the prompt of request r finds its pages
        return pg.pages_for(prompt_lens[jnp.minimum(r, total - 1)], page_tokens) <= top

    again = has_parked & ~waits & fits(own)
    # new requests go to replicas in order; one that cannot take its request stops the later
    # ones this round (request ids stay consecutive)
    can = ~has_parked & empty.any(axis=1) & ~waits
    rank = jnp.cumsum(can) - 1
    wanted = waiting + rank
    ok = can & (wanted < total) & fits(wanted)
    new = ok & (jnp.cumsum(can & ~ok) == 0)
    take = again | new
    request_ids = jnp.where(again, own, jnp.where(new, wanted, total))
    return take, jnp.where(take, local, per_replica), request_ids, new


def refilled(c: PagedCache, slot: Array) -> PagedCache:
    """Slots [W] just re-prefilled or refilled: no longer parked, not waiting for pages."""
    return c._replace(
        parked=c.parked & ~slot, pages=c.pages._replace(granted=c.pages.granted | slot)
    )


def compact(c: PagedCache, take: Callable[[Array], Array]) -> PagedCache:
    """The slots' table rows gathered by `take` (a compaction); pools and free pages stay."""
    p = c.pages
    return c._replace(
        pages=p._replace(table=take(p.table), held=take(p.held), granted=take(p.granted)),
        parked=take(c.parked),
    )
