"""Runs that survive, with real processes (`python run.py`): kill -9 at a random step and the
same command again gives every step once with the uninterrupted run's losses and rewards (2 hosts,
held to test_step_loop's golden records); SIGTERM stops cleanly with a checkpoint and a resume
line; a finished run started again trains nothing."""

import json
import os
import shutil
import signal
import time

import pytest
from cli_runs import (
    RESUMABLE,
    STEPS,
    assert_same_steps,
    finish,
    records,
    run_through,
    start,
    step_records,
    wait_for_steps,
)
from step_loop_reference import REFERENCE, golden_steps

GOLDEN = REFERENCE["runs"]["co_2hosts"]


@pytest.mark.slow
@pytest.mark.xdist_group("two_host_co_run")  # the session's killed run, with test_loopback
def test_kill_9_of_a_two_host_co_run_resumes_on_two_hosts(two_host_co_run):
    run_dir, steps = two_host_co_run.run_dir, len(GOLDEN["steps"]["train/loss"])
    assert 1 <= two_host_co_run.steps_at_kill < steps, "the run finished before the kill"
    assert_same_steps(step_records(run_dir), golden_steps("co_2hosts"), steps)
    evals = [r for r in records(run_dir) if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == GOLDEN["eval_steps"]
    assert [r["eval/accuracy"] for r in evals] == pytest.approx(GOLDEN["eval_accuracy"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps and summary["resume/attempts"] == 2
    assert (run_dir / "policy" / "final" / "model.safetensors").is_file()


STOP_WITHIN_S = 30.0  # a checkpoint of the last step, then every host process gone


@pytest.mark.slow
def test_sigterm_checkpoints_the_last_step_and_says_how_to_resume(tmp_path):
    run_dir = tmp_path / "run"
    run = start(run_dir, [*RESUMABLE, "checkpoint_every_steps=0", "eval_every_steps=0"])
    wait_for_steps(run, run_dir, 2)
    sent = time.monotonic()
    os.killpg(run.pid, signal.SIGTERM)
    output = finish(run, timeout_s=60)
    stop_s = time.monotonic() - sent
    # issue 13 stops within ~5 s on an idle machine; the bound is what a loaded 2-core machine
    # keeps, and the run stopping before its last step (below) is the property
    assert stop_s < STOP_WITHIN_S, f"the stop took {stop_s:.1f} s"
    assert run.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if "resume with:" in line]
    assert len(lines) == 1 and f"hydra.run.dir={run_dir}" in lines[0], output[-2000:]
    done = len(step_records(run_dir))
    saved = [int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()]
    assert saved == [done] and 2 <= done < STEPS


@pytest.mark.slow
@pytest.mark.xdist_group("two_host_co_run")
def test_a_finished_run_started_again_trains_nothing(tmp_path, two_host_co_run):
    run_dir = tmp_path / "run"
    shutil.copytree(two_host_co_run.run_dir, run_dir)
    before = (run_dir / "metrics.jsonl").read_text()
    output = run_through(run_dir, two_host_co_run.args)
    assert "nothing to train" in output
    assert (run_dir / "metrics.jsonl").read_text() == before
