"""The paged KV cache's page allocator (locoexp/rollout/pages.py): no page lost or handed out
twice over 1,000 refills of random lengths, the pool-dry rule (slot order, the rest wait), and
where a row's tokens live. Each check runs the jitted functions the decode loop would run."""

import functools

import jax
import numpy as np

from locoexp.rollout import pages as pg

PAGE = 4

_grow = jax.jit(functools.partial(pg.grow, page_tokens=PAGE))
_release = jax.jit(pg.release)
_preempt = jax.jit(pg.preempt)


def _check_every_page_once(p: pg.Pages) -> None:
    """Free pages and held pages together are every page of the pool, each once; a table holds
    nothing past its `held` pages."""
    free, top, table, held = (np.asarray(x) for x in (p.free, p.top, p.table, p.held))
    pool = free.shape[0]
    column = np.arange(table.shape[1])[None, :]
    used = table[column < held[:, None]]
    np.testing.assert_array_equal(np.sort(np.concatenate([free[:top], used])), np.arange(pool))
    assert (table[column >= held[:, None]] == pool).all()


def test_no_page_is_lost_or_shared_over_1000_refills_of_random_lengths():
    rng = np.random.default_rng(0)
    slots, pool, most = 8, 48, 40  # at most 10 pages a row; 8 full rows would need 80
    per_slot = pg.pages_for(most, PAGE)
    p = pg.empty_pages(pool, slots, per_slot)
    length = np.zeros(slots, np.int32)  # tokens each slot's request holds
    target = rng.integers(1, most + 1, slots).astype(np.int32)  # prompt + completion of each
    refills, waited, preempted, iterations = 0, 0, 0, 0
    while refills < 1000:
        iterations += 1
        assert iterations < 20_000, "the slots stopped making progress"
        # each live row writes 1..6 more tokens (a prefill chunk or decode steps) if it can
        want = np.minimum(length + rng.integers(1, 7, slots), target).astype(np.int32)
        p = _grow(p, want)
        granted = np.asarray(p.granted)
        waited += int((~granted).sum())
        length = np.where(granted, want, length)
        p, victim = _preempt(p, np.ones(slots, bool))
        length = np.where(np.asarray(victim), 0, length)  # starts over: recomputed
        preempted += int(np.asarray(victim).sum())
        ended = length >= target
        p = _release(p, ended)
        _check_every_page_once(p)
        assert (np.asarray(p.held) == np.where(ended, 0, -(-length // PAGE))).all()
        refills += int(ended.sum())
        length = np.where(ended, 0, length)
        target = np.where(ended, rng.integers(1, most + 1, slots), target).astype(np.int32)
    assert waited > 0 and preempted > 0  # the pool ran dry on the way, and came back
    p = _release(p, np.ones(slots, bool))
    assert int(p.top) == pool


def test_a_dry_pool_serves_slots_in_order_and_the_rest_wait_until_pages_come_back():
    p = pg.empty_pages(6, 4, 5)
    p = _grow(p, np.full(4, 8, np.int32))  # 2 pages each, 6 in the pool
    np.testing.assert_array_equal(np.asarray(p.granted), [True, True, True, False])
    np.testing.assert_array_equal(np.asarray(p.held), [2, 2, 2, 0])
    assert int(p.top) == 0
    # slots 0-2 write within their pages: they go on while slot 3 still waits
    p = _grow(p, np.array([8, 8, 8, 8], np.int32))
    np.testing.assert_array_equal(np.asarray(p.granted), [True, True, True, False])
    # slot 0 ends (2 pages free); slot 1 asks for 3 more and waits, and slot 2 behind it does
    # not overtake it, though its one page would fit
    p = _release(p, np.array([True, False, False, False]))
    p = _grow(p, np.array([0, 20, 12, 8], np.int32))
    np.testing.assert_array_equal(np.asarray(p.granted), [True, False, False, False])
    np.testing.assert_array_equal(np.asarray(p.held), [0, 2, 2, 0])
    p = _release(p, np.array([False, False, True, False]))  # slot 2 ends: 4 pages free
    p = _grow(p, np.array([0, 20, 0, 8], np.int32))
    np.testing.assert_array_equal(np.asarray(p.granted), [True, True, True, False])
    np.testing.assert_array_equal(np.asarray(p.held), [0, 5, 0, 0])
    assert int(p.top) == 1
    _check_every_page_once(p)


def test_a_pool_where_every_live_slot_waits_preempts_the_last_one_holding_pages():
    p = _grow(pg.empty_pages(4, 3, 3), np.array([4, 4, 8], np.int32))  # all 4 pages held
    p = _grow(p, np.array([5, 5, 9], np.int32))  # each asks one more: none can go on
    assert not np.asarray(p.granted).any()
    p, victim = _preempt(p, np.ones(3, bool))
    np.testing.assert_array_equal(np.asarray(victim), [False, False, True])
    np.testing.assert_array_equal(np.asarray(p.held), [1, 1, 0])
    assert int(p.top) == 2
    p = _grow(p, np.array([5, 5, 0], np.int32))  # slot 2 starts over later
    np.testing.assert_array_equal(np.asarray(p.granted), [True, True, True])
    p, victim = _preempt(p, np.ones(3, bool))
    assert not np.asarray(victim).any()  # someone went on: nobody is preempted
    _check_every_page_once(p)


def test_a_row_larger_than_the_pool_is_never_granted():
    p = pg.empty_pages(3, 2, 4)
    p = _grow(p, np.array([13, 0], np.int32))  # 4 pages of 4 tokens; the pool has 3
    np.testing.assert_array_equal(np.asarray(p.granted), [False, True])
    assert int(p.top) == 3 and int(p.held.sum()) == 0
    assert pg.pages_for(13, PAGE) == 4


def test_a_token_lives_in_its_rows_page_at_position_mod_page():
    p = _grow(pg.empty_pages(8, 2, 3), np.array([9, 5], np.int32))  # 3 pages, 2 pages
    page, offset = pg.slot_of_token(p, np.array([8, 5]), page_tokens=PAGE)
    table = np.asarray(p.table)
    np.testing.assert_array_equal(np.asarray(page), [table[0, 2], table[1, 1]])
    np.testing.assert_array_equal(np.asarray(offset), [0, 1])
    page, _ = pg.slot_of_token(p, np.array([12, 8]), page_tokens=PAGE)  # not held: no page
    np.testing.assert_array_equal(np.asarray(page), [8, 8])
