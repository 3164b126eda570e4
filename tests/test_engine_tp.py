"""A tensor-parallel JAX engine gives the single-device engine's results (Section 4.1's TP
samplers): TP2 (x DP2) and TP4 over four CPU devices against TP1 on one device, logits within
1e-5 and greedy tokens exactly.

The four devices exist only if XLA is told before jax starts, so the engines run in a
subprocess (tests/engine_tp_worker.py) and this test compares what it wrote.
"""

import numpy as np
import pytest
from workers import worker_results

pytestmark = pytest.mark.slow  # real processes


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return worker_results("engine_tp_worker.py", tmp_path_factory.mktemp("tp"))


@pytest.mark.parametrize("layout", ["tp2", "tp4"])
def test_tensor_parallel_engine_equals_tp1_on_one_device(results, layout):
    reference = "tp1_1dev"
    np.testing.assert_allclose(
        results[f"{layout}_logits"], results[f"{reference}_logits"], atol=1e-5, rtol=0
    )
    np.testing.assert_array_equal(
        results[f"{layout}_greedy_tokens"], results[f"{reference}_greedy_tokens"]
    )
    np.testing.assert_array_equal(
        results[f"{layout}_sampled_tokens"], results[f"{reference}_sampled_tokens"]
    )
    for label in ("greedy", "sampled"):
        np.testing.assert_allclose(
            results[f"{layout}_{label}_logprobs"],
            results[f"{reference}_{label}_logprobs"],
            atol=1e-5,
            rtol=0,
        )
        # capacity 4: 8 requests through 4 slots, refilled on device (continuous batching)
        assert results[f"{layout}_{label}_waves"] == 1


def test_tensor_parallel_engine_holds_a_slice_of_the_mlp_per_device(results):
    """TINY's MLP width 64: a whole up_proj on TP1, half on TP2, a quarter on TP4."""
    for layout, columns in (("tp1_1dev", 64), ("tp2", 32), ("tp4", 16)):
        assert results[f"{layout}_up_proj_shard_columns"] == columns


def test_bf16_tensor_parallel_engine_takes_published_fp32_weights(results):
    assert list(results["bf16_dtypes"]) == ["bfloat16"]
    np.testing.assert_array_equal(
        results["bf16_republished_tokens"], results["bf16_started_tokens"]
    )
    np.testing.assert_array_equal(
        results["bf16_republished_logprobs"], results["bf16_started_logprobs"]
    )


def test_continuous_batching_equals_static_waves_on_a_sharded_layout(results):
    """4 slots for 8 requests, refilled on device (the default scheduler) on TP2 x DP2: each
    request's completion is the one static waves give it (its own PRNG stream)."""
    layout = "tp2"
    for label in ("greedy", "sampled"):
        np.testing.assert_array_equal(
            results[f"{layout}_{label}_tokens"], results[f"waves_{layout}_{label}_tokens"]
        )


def test_compaction_on_replicas_gives_the_completions_of_static_waves(results):
    """32 requests of forced, uneven lengths through 16 slots of DP2 x TP2: refilled, then each
    replica's live rows compacted 16 -> 8 on its own devices."""
    assert results["replicas_refills"] == 16
    np.testing.assert_array_equal(results["replicas_continuous_lengths"], results["replicas_caps"])
    np.testing.assert_array_equal(
        results["replicas_continuous_tokens"], results["replicas_waves_tokens"]
    )


def test_refill_and_compaction_keep_each_replicas_cache_on_its_devices(results):
    """Written over the global slots, the refill's scatter all-gathered every replica's
    prefilled cache rows to every device (8 per call: K and V of 4 layers), and the compaction's
    gather all-reduced the whole narrower cache over the data axis, with temporaries of twice
    the narrower cache per device (4x at DP4; experiments/LOG.md, session 19). Each replica
    now works on its own rows: no collective carries a cache-shaped array."""
    assert list(results["replicas_programs"]) == [2, 1]  # run at 16 and 8 slots, one compaction
    assert not results["replicas_run_cache_collectives"].any()
    assert not results["replicas_compact_cache_collectives"].any()
    assert (results["replicas_compact_temp_bytes"] < results["replicas_narrow_cache_bytes"]).all()


def test_a_tensor_parallel_engine_splits_the_vocabulary_and_never_gathers_the_logits(results):
    """TP4 over a 1,024-token vocabulary: each device holds 256 rows of the (tied) embedding and
    computes its 256 logits; the exact sampler and top-p alone keep to those shards (no
    collective carries a vocabulary-sized array; top-p alone sorted all V before, a sort XLA
    distributed over the shards); top-p alone draws TP1's tokens."""
    assert results["vocab_tp4_embedding_rows"] == 256
    assert results["vocab_tp1_embedding_rows"] == 1024
    for label in ("full", "top_p"):
        assert results[f"vocab_tp4_{label}_logits_collectives"] == 0, label
    np.testing.assert_array_equal(
        results["vocab_tp4_top_p_tokens"], results["vocab_tp1_top_p_tokens"]
    )
