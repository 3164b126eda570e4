"""The trainer's attention kernels equal the dense reference in values and gradients (fp32,
1e-5) on packed rows with several segments, padding and the causal mask; the kernels a backend
cannot run are refused with one sentence; the model's packed forward equals its masked forward.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_policy import random_prompts, tiny_model

from locoexp.config import Config
from locoexp.errors import ConfigError
from locoexp.model.attention import (
    AttentionSpec,
    attend,
    blockwise_attention,
    causal_segment_mask,
    dense_attention,
    splash_attention,
)
from locoexp.model.config import AttentionKind, RematPolicy, attention_block
from locoexp.trainer.config import TrainerConfig, check_attention_backend, check_remat_backend

KV_HEADS, PER_KV, HEAD_DIM = 2, 2, 16


def packed_inputs(rows: int, tokens: int, segments: list[list[int]], *, seed: int, head_dim=16):
    """q, k, v and segment ids [R, T] whose rows hold sequences of the given lengths (then
    padding), and a random cotangent that is zero on padding queries (they reach no loss)."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((rows, tokens), np.int32)
    for r, lengths in enumerate(segments):
        offset = 0
        for s, n in enumerate(lengths, start=1):
            seg[r, offset : offset + n] = s
            offset += n
    q = rng.normal(size=(rows, tokens, KV_HEADS * PER_KV, head_dim)).astype(np.float32)
    k, v = (rng.normal(size=(rows, tokens, KV_HEADS, head_dim)).astype(np.float32) for _ in "kv")
    weights = rng.normal(size=q.shape).astype(np.float32) * (seg > 0)[:, :, None, None]
    return tuple(map(jnp.asarray, (q, k, v, seg, weights)))


def assert_matches_dense(kernel, q, k, v, seg, weights):
    """Outputs at real (non-padding) queries and gradients of q, k, v within 1e-5."""
    real = np.asarray(seg > 0)
    expected, got = dense_attention(q, k, v, seg), kernel(q, k, v, seg)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(expected)[real], atol=1e-5)

    def grads(fn):
        loss = lambda q, k, v: (fn(q, k, v, seg) * weights).sum()
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    for want, have in zip(grads(dense_attention), grads(kernel), strict=True):
        np.testing.assert_allclose(np.asarray(have), np.asarray(want), atol=1e-5)


# rows: several sequences, one filling the row, one with trailing padding
SEGMENTS = [[10, 23, 1, 30], [64], [5, 40]]


@pytest.mark.parametrize("block", [8, 16, 24, 512])
def test_blockwise_equals_dense_in_values_and_gradients(block):
    """Blocks smaller than a sequence, not dividing the row (24), and larger than the row."""
    inputs = packed_inputs(3, 64, SEGMENTS, seed=block)
    assert_matches_dense(lambda q, k, v, s: blockwise_attention(q, k, v, s, block), *inputs)


def test_blockwise_equals_dense_when_the_row_is_not_a_multiple_of_the_block():
    inputs = packed_inputs(2, 37, [[12, 20], [3, 3, 31]], seed=3)
    assert_matches_dense(lambda q, k, v, s: blockwise_attention(q, k, v, s, 16), *inputs)


def test_a_row_is_cut_into_the_fewest_equal_blocks():
    """At most `block_tokens` per block, a multiple of 8, and less than 8 padding tokens per
    block: a row just past a multiple of the block gets two equal blocks, not a padded third."""
    assert attention_block(264, 256) == 136  # not 256 + 8 padded to 512
    assert attention_block(2560, 256) == 256 and attention_block(40, 512) == 40
    for tokens in range(1, 700, 7):
        for block_tokens in (8, 16, 128, 256):
            size = attention_block(tokens, block_tokens)
            blocks = -(-tokens // size)
            assert size <= block_tokens and size % 8 == 0
            assert blocks == -(-tokens // block_tokens)  # no more blocks than the largest size
            assert blocks * size - tokens < 8 * blocks


def test_attend_cuts_a_row_past_a_block_into_equal_blocks():
    """A 40-token row at block_tokens=32 runs as 2 blocks of 24 and still equals dense."""
    inputs = packed_inputs(2, 40, [[33, 7], [17]], seed=5)
    spec = AttentionSpec(kind=AttentionKind.blockwise, block_tokens=32)
    assert_matches_dense(lambda q, k, v, s: attend(spec, q, k, v, s), *inputs)


def test_blockwise_backward_keeps_no_row_by_row_array():
    """The compiled gradient's temporaries hold no [T, T] (or [heads, T, T]) array."""
    q, k, v, seg, weights = packed_inputs(1, 2048, [[700, 1348]], seed=0)
    loss = lambda q, k, v: (blockwise_attention(q, k, v, seg, 128) * weights).sum()
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile().as_text()
    assert "2048,2048]" not in text


def test_splash_kernel_in_interpret_mode_equals_dense():
    """JAX's Pallas splash kernel, run by the Pallas interpreter on CPU, at a small shape."""
    inputs = packed_inputs(1, 128, [[50, 50]], seed=1, head_dim=64)
    assert_matches_dense(lambda q, k, v, s: splash_attention(q, k, v, s, interpret=True), *inputs)


def test_model_packed_forward_equals_masked_forward_for_every_remat_policy():
    """The trainer path (segment ids, blockwise kernel, remat) gives the masked forward's
    hidden states; remat changes what is stored, not what is computed."""
    model = tiny_model(seed=0)
    tokens = np.concatenate(random_prompts([7, 9, 16], seed=4)).reshape(1, 32)
    seg = np.repeat([1, 2, 3], [7, 9, 16]).reshape(1, 32).astype(np.int32)
    positions = np.concatenate([np.arange(7), np.arange(9), np.arange(16)]).reshape(1, 32)
    expected, _ = model(tokens, positions, causal_segment_mask(jnp.asarray(seg)))
    spec = AttentionSpec(kind=AttentionKind.blockwise, block_tokens=8)
    for policy in (RematPolicy.none, RematPolicy.block, RematPolicy.save_matmuls):
        hidden = model.packed_hidden(tokens, positions, seg, attention=spec, remat=policy)
        np.testing.assert_allclose(np.asarray(hidden), np.asarray(expected), atol=1e-5)


def test_attend_dispatches_dense_and_blockwise():
    q, k, v, seg, _ = packed_inputs(3, 64, SEGMENTS, seed=9)
    dense = attend(AttentionSpec(kind=AttentionKind.dense), q, k, v, seg)
    blockwise = attend(AttentionSpec(kind=AttentionKind.blockwise, block_tokens=16), q, k, v, seg)
    real = np.asarray(seg > 0)
    np.testing.assert_allclose(np.asarray(blockwise)[real], np.asarray(dense)[real], atol=1e-5)


@pytest.mark.parametrize(
    ("kind", "platform"), [(AttentionKind.splash, "cpu"), (AttentionKind.splash, "gpu"),
                           (AttentionKind.cudnn, "cpu"), (AttentionKind.cudnn, "tpu")],
)  # fmt: skip
def test_a_kernel_the_backend_cannot_run_is_refused_in_one_sentence(kind, platform):
    with pytest.raises(ConfigError, match=rf"^trainer.attention={kind.value} runs only on .*\.$"):
        check_attention_backend(kind, platform)


def test_every_backend_runs_blockwise_and_dense():
    for platform in ("cpu", "gpu", "tpu"):
        check_attention_backend(AttentionKind.blockwise, platform)
        check_attention_backend(AttentionKind.dense, platform)
    check_attention_backend(AttentionKind.splash, "tpu")
    check_attention_backend(AttentionKind.cudnn, "gpu")


def test_host_offload_remat_is_refused_on_cpu():
    with pytest.raises(ConfigError, match=r"^trainer.remat=offload runs only on gpu/tpu"):
        check_remat_backend(RematPolicy.offload, "cpu")
    check_remat_backend(RematPolicy.offload, "tpu")
    check_remat_backend(RematPolicy.save_matmuls, "cpu")


def test_the_run_config_refuses_a_kernel_its_hardware_cannot_run():
    """`python run.py trainer.attention=splash` on hardware=cpu fails at start-up (exit 2)."""
    with pytest.raises(
        ConfigError, match=r"^trainer.attention=splash runs only on tpu, not on cpu;"
    ):
        Config(trainer=TrainerConfig(attention=AttentionKind.splash))
    with pytest.raises(ConfigError, match=r"^trainer.remat=offload runs only on gpu/tpu"):
        Config(trainer=TrainerConfig(remat=RematPolicy.offload))
