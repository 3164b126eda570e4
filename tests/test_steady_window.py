"""One definition of warm-up and the steady window (`locoexp.metrics.steady`): the run's
summary, the analysis and the tools pick the same steps, and the summary's step time leaves the
compiling warm-up out."""

from locoexp.analysis.runs import Run, steady_window
from locoexp.metrics.run_output import summarize_steps
from locoexp.metrics.run_records import RunRecords
from locoexp.metrics.steady import WARMUP_STEPS, SteadyWindow
from locoexp.metrics.steady import steady_window as window_of


def test_one_pass_is_steady_after_warm_up_and_two_passes_in_appendix_a_s_window():
    assert (window_of(steps=10).first, window_of(steps=10).last) == (WARMUP_STEPS, 9)
    second = window_of(steps=40, batches_per_pass=20, passes=2)  # Appendix A: steps 23-38 of 40
    assert (second.first, second.last) == (23, 38)
    cut = window_of(steps=30, batches_per_pass=20, passes=2)  # ended inside its second pass
    assert (cut.first, cut.last) == (WARMUP_STEPS, 29)
    assert (window_of(steps=1).first, window_of(steps=1).last) == (0, 0)


def records(step_s: list[float]) -> list[dict]:
    return [
        {"step": n, "timing/step_s": s, "rollout/reward_mean": 0.5} for n, s in enumerate(step_s)
    ]


def test_the_summary_s_step_time_is_the_steady_median_not_the_compiling_steps():
    steps = records([40.0, 9.0, 2.0, 1.0, 3.0])
    assert summarize_steps(steps)["step_s_median"] == 2.0  # steps 2-4 (all five: 3.0)
    given = SteadyWindow(first=3, last=4, rule="given")
    assert summarize_steps(steps, given)["step_s_median"] == 2.0  # steps 3-4: 1.0 and 3.0
    assert summarize_steps(records([40.0]))["step_s_median"] == 40.0  # a one-step run


def test_the_analysis_reads_the_window_the_run_used(tmp_path):
    config = {"steps": 40, "dataset": {"batches_per_pass": 20, "passes": 2}}
    steps = records([1.0] * 40)
    run = Run(
        records=RunRecords(
            run_dir=tmp_path, placement="co", chips=1, chip_hour_price_usd=0.0, steps=steps,
            evals=[],
        ),
        config=config,
        summary={},
    )  # fmt: skip
    assert steady_window(run) == window_of(steps=40, batches_per_pass=20, passes=2)
