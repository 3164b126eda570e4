"""Expert parallelism gives the one-device results: a tiny Qwen3-MoE trained at EP2 (fsdp2 x
expert2) over four CPU devices gives the one-device step's loss, metrics, gradients and updated
parameters within fp32 tolerance, each device holding E/EP experts; engines of a tiny Qwen3-MoE
at EP2 (DP2) and of a tiny Gemma4 MoE at EP2 x TP2 give the one-device engine's greedy and sampled
tokens exactly and its log-probs within 1e-5. Also the start-up refusals of an EP degree the
experts or the devices cannot take.

The four devices exist only if XLA is told before jax starts, so the trainers and engines run
in a subprocess (tests/moe_ep_worker.py) and this test compares what it wrote.
"""

import numpy as np
import pytest
from moe_ep_cases import ENGINE_LAYOUTS, ENGINES, MODELS, TRAINERS
from test_moe_trainer import MOE
from tiny_policy import TINY
from workers import worker_results

from locoexp.errors import ConfigError
from locoexp.rollout.config import RolloutConfig
from locoexp.rollout.sharding import check_expert_parallel, resolve_expert_parallel
from locoexp.trainer.config import TrainerConfig


@pytest.fixture(scope="module")
def layer(tmp_path_factory):
    return worker_results("moe_ep_layer_worker.py", tmp_path_factory.mktemp("ep_layer"))


@pytest.mark.slow
def test_the_tpu_weight_gradient_split_over_a_mesh_adds_to_one_devices(layer):
    """`moe.weight_gradient` (megablox's tgmm, in Pallas' interpreter) with its rows split over
    2 x 2 CPU devices, each device's share of each group its own rows': the shares' sum is the
    one-device gradient."""
    want = layer["kernel/one"]
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(layer["kernel/split"], want, atol=1e-4, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("ep", [1, 2, 4])
def test_an_expert_parallel_moe_layer_equals_one_device_with_its_gradients(layer, ep):
    """The trainer's layer (`expert_mesh(mesh, <every axis>)`): tokens split over every device
    of an (fsdp[, expert]) mesh, each device sorting its own (under EP its expert group's), the
    stacks along `expert`: one device's routed output and gradients of the tokens, routing
    weights and experts."""
    for key in ("out", "grad_x", "grad_weights", "grad_gate", "grad_up", "grad_down"):
        want = layer[f"one/{key}"]
        assert np.abs(want).max() > 1e-3, key  # not a comparison of zeros
        np.testing.assert_allclose(layer[f"ep{ep}/{key}"], want, atol=1e-5, rtol=1e-5, err_msg=key)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return worker_results("moe_ep_worker.py", tmp_path_factory.mktemp("ep"))


def _layout(results, name: str, role: str, layout: str) -> dict[str, np.ndarray]:
    prefix = f"{name}/{role}/{layout}/"
    return {k[len(prefix) :]: v for k, v in results.items() if k.startswith(prefix)}


TRAINED = [(name, layout) for name in MODELS for layout in TRAINERS[name] if layout != "one_device"]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layout"), TRAINED)
def test_expert_parallel_train_step_equals_the_one_device_step(results, name, layout):
    want, got = (
        _layout(results, name, "train", "one_device"),
        _layout(results, name, "train", layout),
    )
    assert got.keys() == want.keys() and "train/router_loss" in got and "train/kl" in got
    grads = [k for k in want if k.startswith("grad")]
    scale = max(np.abs(want[k]).max() for k in grads)
    assert scale > 1e-3  # the comparison is not between zeros
    for key in want.keys() - {"expert_shard_rows"}:
        atol = 1e-5 * scale if key.startswith("grad") else 1e-5
        np.testing.assert_allclose(got[key], want[key], atol=atol, rtol=1e-5, err_msg=key)
    experts = MODELS[name].num_experts
    assert int(got["expert_shard_rows"]) == experts // TRAINERS[name][layout][1]
    assert int(want["expert_shard_rows"]) == experts


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "layout"),
    [
        (name, layout)
        for name in MODELS
        for layout in ENGINE_LAYOUTS[name]
        if layout != "one_device"
    ],
)
def test_expert_parallel_engine_equals_the_one_device_engine(results, name, layout):
    want, got = (
        _layout(results, name, "engine", "one_device"),
        _layout(results, name, "engine", layout),
    )
    devices, ep, tp = ENGINES[layout]
    assert int(got["replicas"]) == devices // (ep * tp)
    for label in ("greedy", "sampled"):
        np.testing.assert_array_equal(got[f"{label}_tokens"], want[f"{label}_tokens"])
        np.testing.assert_allclose(
            got[f"{label}_logprobs"], want[f"{label}_logprobs"], atol=1e-5, rtol=0
        )


def test_an_expert_parallel_degree_must_divide_the_experts_and_the_devices():
    with pytest.raises(
        ConfigError, match=r"rollout.expert_parallel=3 must divide model.num_experts=4"
    ):
        check_expert_parallel(MOE, "rollout.expert_parallel", 3, 4)
    with pytest.raises(ConfigError, match=r"trainer.expert_parallel=4 must divide .* 2 devices"):
        check_expert_parallel(MOE, "trainer.expert_parallel", 4, 2)
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        check_expert_parallel(TINY, "trainer.expert_parallel", 2, 4)
    with pytest.raises(ConfigError, match="rollout.expert_parallel=-1"):
        RolloutConfig(expert_parallel=-1)
    with pytest.raises(ConfigError, match="trainer.expert_parallel=0"):
        TrainerConfig(expert_parallel=0)


def test_expert_parallel_zero_takes_the_most_that_divide_experts_and_devices():
    assert resolve_expert_parallel(MOE, 0, 8) == 4  # 4 experts
    assert resolve_expert_parallel(MOE, 0, 2) == 2
    assert resolve_expert_parallel(MOE, 1, 8) == 1
    assert resolve_expert_parallel(TINY, 0, 8) == 1  # dense
