"""The start-up fit check (`compiled/startup.py`): the plan alone for small runs, XLA's compile
where the plan could be wrong, and XLA's verdict followed by `build_spec`."""

import dataclasses
import os
import signal

import pytest

from locoexp.compiled import startup, worker
from locoexp.compose import compose_config
from locoexp.errors import ConfigError
from locoexp.planner import resolve_plan
from locoexp.planner.fit import paper_layout
from locoexp.session.build import build_spec, plan_setup

HUGE_RANK = ["adapter=lora", "adapter.rank=1000000"]  # the adapters alone outgrow 24 GiB
# A rank XLA cannot fit on a stated half-GiB device, at sizes the user fixed (nothing to shrink):
# the same refusal as HUGE_RANK's on this machine, at a tiny run's compile cost.
HALF_GIB = [
    "adapter=lora",
    "adapter.rank=16384",
    "hardware.memory_per_device_gib=0.5",
    "trainer.micro_batch_rows=4",
    "rollout.capacity=32",
]


def test_a_small_run_is_decided_by_the_plan_alone():
    config = compose_config([])
    plan = resolve_plan(plan_setup(config))
    assert startup.plan_share(config, plan) <= startup.PLAN_ALONE_BELOW
    assert startup.check_memory(config) is None  # no compile
    assert startup.judged(config) is None


def test_a_run_on_a_tpu_slice_always_compiles(monkeypatch):
    """On a slice the plan ranged from 0.11 to 1.41 of XLA-TPU's peak: however small its share,
    it never decides alone."""
    config = compose_config(["hardware=tpu_v5e_4"])
    plan = resolve_plan(plan_setup(config))
    assert startup.plan_share(config, plan) <= startup.PLAN_ALONE_BELOW
    assert not startup.plan_decides(config, plan)
    compiled = []

    @dataclasses.dataclass
    class Fits:  # XLA's verdict, as `compile_in_child` returns it
        fits: bool = True

    monkeypatch.setattr(
        startup, "compile_in_child", lambda config: compiled.append(config) or Fits()
    )
    monkeypatch.setattr(startup, "_JUDGED", {})
    assert startup.check_memory(config).fits and compiled == [config]


def test_the_plan_counts_the_low_rank_activations_of_every_adapted_projection():
    """`adapter.rank` grows the activations: one [tokens, r] per projection per block."""

    def activations(rank: int) -> int:
        setup = paper_layout(plan_setup(compose_config(["adapter=lora", f"adapter.rank={rank}"])))
        return resolve_plan(setup).trainer.activations, setup

    low, setup = activations(1000)
    high, _ = activations(2000)
    tokens = setup.dataset.prompts_per_step * setup.dataset.samples_per_prompt
    rows = resolve_plan(setup).trainer_shape
    per_rank = rows.micro_batch_rows * rows.row_tokens * setup.model.num_layers * 7 * 4
    assert high - low == 1000 * per_rank, (tokens, rows)


def test_xla_fitting_a_run_the_plan_refuses_lets_build_spec_build_it(monkeypatch):
    config = compose_config(HUGE_RANK)
    with pytest.raises(ConfigError, match="does not fit"):
        build_spec(config)  # the plan's refusal

    @dataclasses.dataclass
    class Fits:  # XLA's verdict, as `compile_in_child` returns it
        fits: bool = True

    monkeypatch.setattr(startup, "compile_in_child", lambda config: Fits())
    monkeypatch.setattr(startup, "_JUDGED", {})
    assert startup.check_memory(config).fits
    assert startup.judged(config) is config
    build_spec(config, xla=startup.judged(config))  # follows XLA, as main and preflight ask


@pytest.mark.slow
def test_a_rank_xla_cannot_fit_is_refused_at_start_up_with_xlas_figure(monkeypatch):
    """The plan once said "fits" for ranks whose step then failed allocating (issue 44); now
    the plan counts the rank and XLA's compile (a real one, in the child process) decides."""
    monkeypatch.setattr(startup, "_JUDGED", {})
    config = compose_config(HALF_GIB)
    with pytest.raises(ConfigError) as refused:
        startup.check_memory(config)
    sentence = str(refused.value)
    assert "XLA compiled the run's programs for cpu before allocating anything" in sentence
    assert "the trainer needs" in sentence and "more than the device's 0.50" in sentence
    assert "the plan estimated" in sentence
    assert "\n" not in sentence
    assert startup.judged(config) is None  # build_spec keeps the plan's refusal


def test_a_compiler_that_aborts_is_one_sentence_and_the_next_compile_starts_a_new_child():
    """libtpu's CHECK failures kill the compile child with SIGABRT: the run is refused in one
    sentence naming the check, not a traceback, and the pool replaces the dead child."""
    config = compose_config(["hardware=tpu_v7x_8"])
    child = worker.pooled(config)
    os.kill(child._process.pid, signal.SIGABRT)
    child._process.wait()
    with pytest.raises(ConfigError) as refused:
        child.compile(config)
    assert "the compiler aborted (signal 6)" in str(refused.value)
    assert worker.pooled(config) is not child and worker.pooled(config).alive
    worker.close_pool()
    said = (
        "F1206 04:31:14.98 8714 rotated_pincer_fusion_emitter.cc:1889] Check failed: "
        "*color_count != 1 (1 vs. 1) \n*** Check failure stack trace: ***\n    @ 0x7ff7 Flush()\n"
    )
    sentence = worker.compiler_died(config, -6, said)
    assert "the compiler aborted (Check failed: *color_count != 1 (1 vs. 1))" in sentence
    assert "\n" not in sentence
