"""An FSDP trainer over four devices gives the one-device step's loss, metrics and gradients, in
one shot and in micro-batches, where each micro-batch's loss slots are grouped per device lane
and the fused head runs inside its vjp (`trainer/micro.py`), with a KL reference; and the
step gathers weights and loss slots, never a row activation.

The four devices exist only if XLA is told before jax starts, so the trainers run in a
subprocess (tests/trainer_fsdp_worker.py) and this test compares what it wrote.
"""

import numpy as np
import pytest
from test_planner_xla import SHAPES, TOLERANCE
from workers import worker_results

from locoexp.model.sizes import count_parameters_by_formula
from locoexp.planner.estimate import TrainerShape, estimate_trainer
from locoexp.trainer.config import AttentionKind, RematPolicy

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


def test_micro_batched_plan_on_four_devices_is_within_25_percent_of_xla(results):
    """The plan of one FSDP device (test_planner_xla's Qwen3-vocabulary shape, 4 devices'
    worth of rows and loss slots, micro-batches of one row) against XLA's footprint of that
    device's program: the head's three [V, D] float32 buffers are sharded like the head weight
    (counted whole, the plan read 1.56x XLA's footprint)."""
    model, (rows, row_tokens, slots), _ = SHAPES["qwen-vocab-f32"]
    shape = TrainerShape(
        devices=4,
        rows=rows,
        row_tokens=row_tokens,
        micro_batch_rows=1,
        loss_slots=slots,
        logit_chunk=512,
        attention=AttentionKind.blockwise,
        attention_block=128,
        remat=RematPolicy.none,
        kl_reference=False,
    )
    planned = estimate_trainer(model, count_parameters_by_formula(model), shape).total
    measured = int(results["xla4/micro1"])
    assert abs(planned / measured - 1) <= TOLERANCE, (planned, measured)


@pytest.mark.parametrize("kind", ["dense", "blockwise"])
def test_fsdp_step_never_gathers_a_row_activation(results, kind):
    """The packed forward pins its activations to the row axis (`AttentionSpec.rows`): without
    it Shardy carried the embedding's hidden-axis sharding of the embedded task's model into the
    attention blocks and XLA replicated them whole, forward and backward ("Involuntary full
    rematerialization": 22 extra all-gathers, about 1.2x the step's footprint)."""
    assert results[f"row_gathers/{kind}"].size == 0, results[f"row_gathers/{kind}"]


def test_splash_runs_on_each_devices_rows(results):
    """`trainer.attention=splash` on more than one chip: the Pallas kernel is called by each
    device on its own rows (`attention.on_own_rows`). The interpreted kernel equals dense
    attention in values and gradients with no all-gather, and the FSDP train step with the TPU
    (Mosaic) kernel exports for TPU; without the per-device call it failed with "Mosaic kernels
    cannot be automatically partitioned"."""
    assert "splash_rows/tpu_error" not in results, results["splash_rows/tpu_error"]
    assert results["splash_rows/tpu_kernels"] >= 2  # the forward and the backward kernels
    assert results["splash_rows/max_diff"] < 1e-5
    assert results["splash_rows/all_gathers"] == 0
