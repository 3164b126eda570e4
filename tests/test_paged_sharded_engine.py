"""A paged KV cache on sharded engines (DP2 x TP2, a mixture of experts at EP2) gives
each request the dense cache's greedy completion on the same layout and on one device, with a
pool of one row at its caps per replica (rows wait for pages and are preempted on each replica),
and no collective of its slot programs carries a cache-shaped array: each replica's pages, page
table and refills stay on its own devices, heads split over TP as the dense cache's.

The four devices exist only if XLA is told before jax starts, so the engines run in a
subprocess (tests/paged_sharded_worker.py) and this test compares what it wrote.
"""

import numpy as np
import pytest
from workers import worker_results

pytestmark = pytest.mark.slow  # real processes

# DP2 x TP2 holds both axes: TP2 and DP2 apart were two more engine pairs and no other path
SHARDED = ["dp2tp2", "moe_ep2"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return worker_results("paged_sharded_worker.py", tmp_path_factory.mktemp("paged"))


@pytest.mark.parametrize("layout", SHARDED)
def test_paged_cache_gives_the_dense_caches_greedy_completions_on_a_sharded_layout(results, layout):
    reference = "moe_tp1_dense" if layout.startswith("moe") else "tp1_dense"
    for label in (f"{layout}_dense", f"{layout}_paged"):
        np.testing.assert_array_equal(results[f"{label}_lengths"], results[f"{reference}_lengths"])
        np.testing.assert_array_equal(results[f"{label}_tokens"], results[f"{reference}_tokens"])
    # a dry pool on each replica: rows were preempted and prefilled again
    assert results[f"{layout}_paged_refills"] > results[f"{layout}_dense_refills"]


@pytest.mark.parametrize("layout", SHARDED)
def test_paged_slot_programs_carry_no_cache_shaped_collective(results, layout):
    assert not results[f"{layout}_paged_cache_collectives"].any()
