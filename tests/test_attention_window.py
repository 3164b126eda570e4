"""Sliding-window attention (Gemma4's local layers): every kernel equals the dense reference
with the window in values and gradients, and the window changes the result."""

import jax
import numpy as np
import pytest
from test_attention import SEGMENTS, packed_inputs

from locoexp.model.attention import (
    AttentionSpec,
    attend,
    blockwise_attention,
    dense_attention,
    splash_attention,
)
from locoexp.model.config import AttentionKind


def assert_matches_windowed_dense(kernel, window, q, k, v, seg, weights):
    real = np.asarray(seg > 0)

    def reference(q, k, v, s):
        return dense_attention(q, k, v, s, window)

    np.testing.assert_allclose(
        np.asarray(kernel(q, k, v, seg))[real], np.asarray(reference(q, k, v, seg))[real], atol=1e-5
    )

    def grads(fn):
        return jax.grad(lambda q, k, v: (fn(q, k, v, seg) * weights).sum(), argnums=(0, 1, 2))(
            q, k, v
        )

    for want, have in zip(grads(reference), grads(kernel), strict=True):
        np.testing.assert_allclose(np.asarray(have), np.asarray(want), atol=1e-5)


@pytest.mark.parametrize(("block", "window"), [(8, 5), (16, 16), (16, 40), (24, 9)])
def test_blockwise_with_a_window_equals_windowed_dense(block, window):
    inputs = packed_inputs(3, 64, SEGMENTS, seed=block + window)
    assert_matches_windowed_dense(
        lambda q, k, v, s: blockwise_attention(q, k, v, s, block, window), window, *inputs
    )


def test_attend_passes_the_spec_window_and_the_window_matters():
    q, k, v, seg, weights = packed_inputs(2, 40, [[33, 7], [17]], seed=5)
    spec = AttentionSpec(kind=AttentionKind.blockwise, block_tokens=16, window=6)
    assert_matches_windowed_dense(lambda *a: attend(spec, *a), 6, q, k, v, seg, weights)
    real = np.asarray(seg > 0)
    full, windowed = dense_attention(q, k, v, seg), dense_attention(q, k, v, seg, 6)
    assert np.abs(np.asarray(full)[real] - np.asarray(windowed)[real]).max() > 1e-2


def test_splash_kernel_with_a_window_in_interpret_mode_equals_windowed_dense():
    inputs = packed_inputs(1, 128, [[50, 50]], seed=1, head_dim=64)
    assert_matches_windowed_dense(
        lambda q, k, v, s: splash_attention(q, k, v, s, interpret=True, window=20), 20, *inputs
    )
