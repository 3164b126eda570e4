"""An FSDP trainer over four devices gives the one-device step's loss, metrics and gradients, in
one shot and in micro-batches, where each micro-batch's loss slots are grouped per device lane
and the fused head runs inside its vjp (`trainer/micro.py`), with a KL reference.

The four devices exist only if XLA is told before jax starts, so the trainers run in a
subprocess (tests/trainer_fsdp_worker.py) and this test compares what it wrote.
"""

import numpy as np
import pytest
from workers import worker_results

pytestmark = pytest.mark.slow  # a real process


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return worker_results("trainer_fsdp_worker.py", tmp_path_factory.mktemp("fsdp"))


@pytest.mark.parametrize("layout", ["fsdp4", "fsdp4_micro1", "fsdp4_micro2"])
def test_fsdp_step_equals_the_one_device_step(results, layout):
    reference = {k.split("/", 1)[1]: v for k, v in results.items() if k.startswith("one_device/")}
    got = {k.split("/", 1)[1]: v for k, v in results.items() if k.startswith(f"{layout}/")}
    assert got.keys() == reference.keys() and "train/kl" in got
    grads = [k for k in reference if k.startswith("grad/")]
    scale = max(np.abs(reference[k]).max() for k in grads)
    assert scale > 1e-3  # the comparison is not between zeros
    for key, want in reference.items():
        atol = 1e-5 * scale if key.startswith("grad/") else 1e-5
        np.testing.assert_allclose(got[key], want, atol=atol, rtol=0, err_msg=key)
