"""Decode attention over a paged cache (locoexp/model/paged.py) against the dense cache's
`attend_cached` on the same tokens, with and without a sliding window; pages no slot holds are
never read (filled with NaN, the output stays finite and equal), and the tail of a slot's last
page (an earlier request's tokens) is masked."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locoexp.model.layers import attend_cached
from locoexp.model.paged import paged_decode_attention
from locoexp.rollout import pages as pg

SLOTS, HEADS, KV_HEADS, HEAD_DIM, PAGE, POOL = 4, 4, 2, 8, 4, 40
LENGTHS = np.array([1, 7, 20, 13], np.int32)  # one page, a part page, 5 full pages, 4 pages
SLOTS_DENSE = 24


def _paged_and_dense(seed: int):
    rng = np.random.default_rng(seed)
    keys, values = (
        rng.standard_normal((SLOTS, SLOTS_DENSE, KV_HEADS, HEAD_DIM)).astype(np.float32)
        for _ in range(2)
    )
    q = rng.standard_normal((SLOTS, HEADS, HEAD_DIM)).astype(np.float32)
    # a fifth slot takes the pool's last pages first, so that the ones the slots hold are not
    # those an out-of-range index (the table's N past a slot's pages) would be clamped to
    pages = pg.empty_pages(POOL, SLOTS + 1, pg.pages_for(SLOTS_DENSE, PAGE))
    first = pg.grow(pages, jnp.array([0, 0, 0, 0, PAGE]), page_tokens=PAGE)
    table = np.asarray(pg.grow(first, jnp.array([*LENGTHS, PAGE]), page_tokens=PAGE).table)
    table = table[:SLOTS]
    pool = np.full((POOL, PAGE, 2 * KV_HEADS, HEAD_DIM), np.nan, np.float32)  # unheld: NaN
    for row, length in enumerate(LENGTHS):  # a held page's tail: an earlier request's tokens
        pool[table[row, : pg.pages_for(length, PAGE)]] = 1e4
    for row, length in enumerate(LENGTHS):
        for t in range(length):
            pool[table[row, t // PAGE], t % PAGE, 0::2] = keys[row, t]
            pool[table[row, t // PAGE], t % PAGE, 1::2] = values[row, t]
    return q, pool, table, keys, values


@pytest.mark.parametrize("window", [0, 5])
def test_paged_decode_attention_equals_the_dense_cache_and_reads_no_unheld_page(window):
    q, pool, table, keys, values = _paged_and_dense(seed=window)
    paged = jax.jit(functools.partial(paged_decode_attention, window=window))
    got = np.asarray(paged(q, pool, table, LENGTHS))
    rows = np.arange(SLOTS)
    newest = lambda x: x[rows, LENGTHS - 1][:, None]  # noqa: E731 - the token attend_cached writes
    dense = (keys.swapaxes(1, 2), values.swapaxes(1, 2))  # [W, E, S, h]
    expected, _ = attend_cached(
        jnp.asarray(q[:, None]), jnp.asarray(newest(keys)), jnp.asarray(newest(values)),
        jnp.ones((SLOTS, SLOTS_DENSE), bool), dense, jnp.asarray(LENGTHS - 1), window,
    )  # fmt: skip
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, np.asarray(expected)[:, 0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("window", [0, 5])
def test_the_tpu_kernels_reference_semantics_equal_the_xla_path(window):
    """JAX's ragged paged attention (the TPU kernel, locoexp/model/paged_kernel.py) by its own
    reference implementation, called as the engine calls the kernel (one query a slot, the
    table clamped into the pool, `sliding_window` = window), equals `paged_decode_attention` on
    the same pool: the same scale, GQA grouping and window. The kernel itself does not run off
    TPU: its interpret mode (`pltpu.force_tpu_interpret_mode`) fails on the kernel's reshaped
    VMEM ref in jax 0.10.2 ("'ReshapeTransform' object has no attribute 'indices'")."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import (  # noqa: PLC0415
        ref_ragged_paged_attention,
    )

    q, pool, table, _, _ = _paged_and_dense(seed=window + 1)
    q, pool, table, lengths = (jnp.asarray(x) for x in (q, pool, table, LENGTHS))
    got = np.asarray(paged_decode_attention(q, pool, table, lengths, window))
    reference = ref_ragged_paged_attention(
        q, pool, lengths, jnp.minimum(table, POOL - 1), jnp.arange(SLOTS + 1, dtype=jnp.int32),
        jnp.array([SLOTS], jnp.int32), sm_scale=HEAD_DIM**-0.5, sliding_window=window or None,
    )  # fmt: skip
    np.testing.assert_allclose(got, np.asarray(reference).reshape(SLOTS, -1), atol=1e-5, rtol=0)


def test_a_slots_non_finite_keys_stay_its_own():
    """The slots' pages are visited together in chunks and folded per slot: a NaN in one slot's
    live keys (a diverged row) leaves every other slot's output equal to the dense cache's, as
    rows are independent there."""
    q, pool, table, keys, values = _paged_and_dense(seed=3)
    pool[table[2, 1], 0, 0] = np.nan  # slot 2's token 4: a key it attends
    got = np.asarray(jax.jit(paged_decode_attention)(q, pool, table, LENGTHS))
    rows = np.arange(SLOTS)
    newest = lambda x: x[rows, LENGTHS - 1][:, None]  # noqa: E731
    expected, _ = attend_cached(
        jnp.asarray(q[:, None]), jnp.asarray(newest(keys)), jnp.asarray(newest(values)),
        jnp.ones((SLOTS, SLOTS_DENSE), bool), (keys.swapaxes(1, 2), values.swapaxes(1, 2)),
        jnp.asarray(LENGTHS - 1),
    )  # fmt: skip
    assert np.isnan(got[2]).any()  # its heads that read key head 0
    others = [0, 1, 3]
    np.testing.assert_allclose(got[others], np.asarray(expected)[others, 0], atol=1e-5, rtol=0)
