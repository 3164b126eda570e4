"""Expert parallelism gives the one-device results: one MoE layer (`moe.expert_outputs`) under
an (fsdp, expert) mesh at EP2 and EP4, tokens split over every device and the expert stacks
along `expert` as the trainer lays them out, gives the one-device output and the gradients of
the tokens, the routing weights and the experts within fp32 tolerance. Also the start-up
refusals of an EP degree the experts or the devices cannot take.

The four devices exist only if XLA is told before jax starts, so the layer runs in a subprocess
(tests/moe_ep_layer_worker.py) and this test compares what it wrote.
"""

import numpy as np
import pytest
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
@pytest.mark.parametrize("ep", [2, 4])
def test_an_expert_parallel_moe_layer_equals_one_device_with_its_gradients(layer, ep):
    """Tokens split over every device of an (fsdp, expert) mesh, the stacks along `expert`:
    the routed output and the gradients of the tokens, routing weights and experts."""
    for key in ("out", "grad_x", "grad_weights", "grad_gate", "grad_up", "grad_down"):
        want = layer[f"ep1/{key}"]
        assert np.abs(want).max() > 1e-3, key  # not a comparison of zeros
        np.testing.assert_allclose(layer[f"ep{ep}/{key}"], want, atol=1e-5, rtol=1e-5, err_msg=key)


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
