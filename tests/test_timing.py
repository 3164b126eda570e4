"""The per-step phase timer and the per-host reduction."""

import time

import pytest

from locoexp.metrics.timing import StepTimer, reduce_over_hosts


def test_phases_add_up_to_the_step_with_the_unaccounted_remainder():
    timer = StepTimer()
    with timer.step():
        with timer.phase("generation"):
            time.sleep(0.02)
        time.sleep(0.01)  # outside every phase: unaccounted
        with timer.phase("train"):
            time.sleep(0.01)
        with timer.phase("generation"):  # a phase entered twice accumulates
            time.sleep(0.01)
    m = timer.metrics()
    assert set(m) == {
        "timing/generation_s",
        "timing/train_s",
        "timing/step_s",
        "timing/unaccounted_s",
        "timing/compile_s",
    }
    assert m["timing/generation_s"] >= 0.03
    assert m["timing/unaccounted_s"] >= 0.01
    total = m["timing/generation_s"] + m["timing/train_s"] + m["timing/unaccounted_s"]
    assert total == pytest.approx(m["timing/step_s"], abs=1e-9)


def test_each_step_starts_from_zero():
    timer = StepTimer()
    with timer.step(), timer.phase("reward"):
        time.sleep(0.005)
    with timer.step(), timer.phase("pack"):
        pass
    assert "timing/reward_s" not in timer.metrics()


def test_nested_phases_and_phases_outside_a_step_are_refused():
    timer = StepTimer()
    with pytest.raises(RuntimeError, match="inside StepTimer.step"), timer.phase("train"):
        pass
    with (
        timer.step(),
        timer.phase("train"),
        pytest.raises(RuntimeError, match="inside phase 'train'"),
        timer.phase("pack"),
    ):
        pass


def test_metrics_before_any_step_are_refused():
    with pytest.raises(RuntimeError, match="finished step"):
        StepTimer().metrics()


def test_reduce_over_hosts_gives_max_and_mean():
    reduced = reduce_over_hosts([{"timing/generation_s": 1.0}, {"timing/generation_s": 3.0}])
    assert reduced == {"timing/generation_s_max": 3.0, "timing/generation_s_mean": 2.0}


def test_reduce_over_hosts_refuses_hosts_with_different_keys():
    with pytest.raises(ValueError, match="host 1"):
        reduce_over_hosts([{"a": 1.0}, {"b": 1.0}])


def test_elapsed_inside_a_step_grows_and_is_refused_outside():
    timer = StepTimer()
    with pytest.raises(RuntimeError):
        timer.elapsed_s()
    with timer.step():
        with timer.phase("admission"):
            time.sleep(0.01)
        head = timer.elapsed_s()
        with timer.phase("generation"):
            time.sleep(0.01)
    assert 0.01 <= head <= timer.metrics()["timing/step_s"] - 0.01


def test_host_orchestration_is_the_host_phases_plus_the_unaccounted_rest():
    from locoexp.metrics.timing import host_orchestration_s

    times = {
        "timing/admission_s": 0.5,
        "timing/generation_s": 3.0,
        "timing/reward_s": 0.25,
        "timing/train_s": 4.0,
        "timing/unaccounted_s": 0.125,
        "timing/step_s": 7.875,
    }
    assert host_orchestration_s(times) == 0.875


def test_a_step_records_the_seconds_of_the_compiles_inside_it_and_none_outside():
    """A compile is the first call of a jitted program at a new shape: the step that runs it
    records its seconds as jax.monitoring reports them; the same shape again compiles nothing;
    a compile between steps is in no step's record."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from locoexp.metrics import compiles  # noqa: PLC0415

    seen: list[float] = []

    def count(event: str, seconds: float, **_) -> None:
        if event in compiles.EVENTS:
            seen.append(seconds)

    program = jax.jit(lambda x: jnp.tanh(x) @ x.T)
    timer = StepTimer()
    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        with timer.step(), timer.phase("train"):
            program(jnp.ones((8, 8))).block_until_ready()
        first, events = timer.metrics(), list(seen)
        with timer.step(), timer.phase("train"):
            program(jnp.ones((8, 8))).block_until_ready()
        again = timer.metrics()["timing/compile_s"]
        program(jnp.ones((4, 4))).block_until_ready()  # outside every step
        with timer.step():
            pass
        between = timer.metrics()["timing/compile_s"]
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert len(events) >= 2  # traced, lowered and compiled where the program first ran
    assert first["timing/compile_s"] == pytest.approx(sum(events), rel=1e-9)
    assert 0 < first["timing/compile_s"] <= first["timing/step_s"]
    assert again == 0.0 and between == 0.0


def test_da_records_each_sides_compile_seconds_beside_the_drivers():
    """Under da the driver's record merges the rollout and trainer actors' reports with its own
    timings: each side's compile seconds keep their own key, and `compile_seconds` adds them."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from locoexp.metrics.compiles import compile_seconds  # noqa: PLC0415
    from locoexp.placement.halves import HalfReport, Window  # noqa: PLC0415
    from locoexp.placement.ray.hosts import side_report  # noqa: PLC0415

    actor = StepTimer()
    with actor.step():
        jax.jit(lambda x: x * 3 + 1)(jnp.ones(5)).block_until_ready()  # its first call compiles
    compiled_s = actor.metrics()["timing/compile_s"]
    report = side_report(HalfReport({}, Window(start=0.0, end=1.0)), actor, "rollout")
    assert report.metrics["timing/rollout_compile_s"] == compiled_s > 0
    assert "timing/compile_s" not in report.metrics
    driver = StepTimer()
    with driver.step():
        pass
    record = {**report.metrics, "timing/trainer_compile_s": 1.0, **driver.metrics()}
    assert compile_seconds(record) == pytest.approx(compiled_s + 1.0)
    assert compile_seconds({"timing/step_s": 1.0}) is None  # a run from before the events
