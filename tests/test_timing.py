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
