"""The mixture-of-experts grouped matmul (`locoexp.model.moe.grouped_matmul`): ragged_dot, whose
weight gradient on TPU is megablox's `tgmm` kernel. The kernel's gradient equals ragged_dot's
(run here in Pallas' interpreter), and compiled for a TPU it costs the routed rows' FLOPs where
XLA-TPU's own is a dense product over every expert."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as PS

from locoexp.compiled import topology
from locoexp.compose import compose_config
from locoexp.model.moe import grouped_matmul, weight_gradient

ROWS, WIDTH, INNER, EXPERTS = 8192, 1024, 768, 64  # Table 1-like routed rows, 64 experts


def _operands(rows=300, width=64, inner=48):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((rows, width)), jnp.float32)
    g = jnp.asarray(rng.standard_normal((rows, inner)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((5, width, inner)), jnp.float32)
    # an empty group and 50 rows past the last one (pairs routed to another device's experts)
    return x, g, w, jnp.asarray([40, 0, 100, 60, 50], jnp.int32)


def test_the_kernels_weight_gradient_is_ragged_dots():
    """300 rows (not a multiple of the 128-row tile): the same gradient as ragged_dot's own,
    rows past the last group adding nothing."""
    x, g, w, sizes = _operands()
    _, pullback = jax.vjp(lambda w: jax.lax.ragged_dot(x, w, sizes), w)
    got = weight_gradient(x, g, sizes, 5, interpret=True)
    np.testing.assert_allclose(got, pullback(g)[0], rtol=1e-5, atol=1e-4)


def test_off_tpu_values_and_gradients_are_ragged_dots():
    x, g, w, sizes = _operands()
    np.testing.assert_array_equal(grouped_matmul(x, w, sizes), jax.lax.ragged_dot(x, w, sizes))
    ours = jax.vjp(lambda x, w: grouped_matmul(x, w, sizes), x, w)[1](g)
    theirs = jax.vjp(lambda x, w: jax.lax.ragged_dot(x, w, sizes), x, w)[1](g)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def _compiled_weight_gradient(sharding, rows_spec):
    x = jax.ShapeDtypeStruct((ROWS, WIDTH), jnp.bfloat16, sharding=rows_spec)
    w = jax.ShapeDtypeStruct((EXPERTS, WIDTH, INNER), jnp.bfloat16, sharding=sharding)
    sizes = jax.ShapeDtypeStruct((EXPERTS,), jnp.int32, sharding=sharding)
    loss = lambda x, w, s: grouped_matmul(x, w, s).astype(jnp.float32).sum()  # noqa: E731
    return jax.jit(jax.grad(loss, argnums=1)).lower(x, w, sizes).compile()


def test_compiled_for_tpu_the_weight_gradient_costs_the_routed_rows():
    """8,192 routed rows, 64 experts of 1,024 x 768, bf16, on one v5e device: the weight
    gradient costs 2 M D F (XLA-TPU's cost analysis; the kernel declares its own), where
    ragged_dot's own compiles to a convolution over the 64 experts (64 times the FLOPs on
    libtpu 0.0.42); split over the slice's 4 devices each computes a quarter."""
    hardware = compose_config(["hardware=tpu_v5e_4"]).hardware
    devices = topology.topology_devices(hardware)
    one = SingleDeviceSharding(devices[0])
    compiled = _compiled_weight_gradient(one, one)
    product = 2 * ROWS * WIDTH * INNER
    assert compiled.cost_analysis()["flops"] == pytest.approx(product, rel=0.02)
    text = compiled.as_text()
    assert "tpu_custom_call" in text and "convolution(" not in text
    mesh = Mesh(np.array(devices).reshape(4), ("data",))
    with jax.set_mesh(mesh):
        spread = _compiled_weight_gradient(
            NamedSharding(mesh, PS()), NamedSharding(mesh, PS("data"))
        )
    assert spread.cost_analysis()["flops"] == pytest.approx(product / 4, rel=0.05)
    assert "convolution(" not in spread.as_text()
