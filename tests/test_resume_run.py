"""Runs that survive, with real processes (`python run.py`): kill -9 at a random step and the
same command again gives every step once with the uninterrupted run's losses and rewards (1 and 2
hosts); SIGTERM stops cleanly with a checkpoint and a resume line; a finished run started again
trains nothing."""

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_runs import (
    DEADLINE_S,
    RESUMABLE,
    STEPS,
    assert_same_steps,
    finish,
    kill,
    run_through,
    start,
)


@pytest.fixture(scope="module")
def one_host_reference(tmp_path_factory) -> Path:
    """The uninterrupted one-host run that the restart test starts again (the kill -9 test runs
    on two hosts, against the two-host reference: the same resume path, one process more)."""
    run_dir = tmp_path_factory.mktemp("one_host") / "reference"
    run_through(run_dir, RESUMABLE)
    return run_dir


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _steps(run_dir: Path) -> list[dict]:
    return [r for r in _records(run_dir) if "eval/accuracy" not in r]


def _checkpointed(run_dir: Path) -> bool:
    directory = run_dir / "checkpoints"
    return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


def _wait_for_steps(
    run: subprocess.Popen, run_dir: Path, count: int, *, checkpoint: bool = False
) -> None:
    begun = time.monotonic()
    while len(_steps(run_dir)) < count or (checkpoint and not _checkpointed(run_dir)):
        if run.poll() is not None:
            pytest.fail(f"the run ended before step {count}: {finish(run)[-2000:]}")
        if time.monotonic() - begun > DEADLINE_S:
            kill(run)
            pytest.fail(f"no step {count} within {DEADLINE_S} s")
        time.sleep(0.05)


def _assert_same_steps(resumed: Path, reference: Path) -> None:
    assert_same_steps(_steps(resumed), _steps(reference), STEPS)
    assert [r["step"] for r in _records(resumed) if "eval/accuracy" in r] == [3, 7]


def _kill_and_resume(tmp_path: Path, reference: Path, extra: list[str]) -> None:
    resumed = tmp_path / "resumed"
    args = [*RESUMABLE, *extra]
    kill_after = random.randint(3, STEPS - 2)  # steps logged when kill -9 lands
    run = start(resumed, args)
    _wait_for_steps(run, resumed, kill_after, checkpoint=True)
    kill(run)
    assert len(_steps(resumed)) < STEPS, "the run finished before the kill"
    run_through(resumed, args)
    _assert_same_steps(resumed, reference)
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["resume/attempts"] == 2
    assert (resumed / "policy" / "final" / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.xdist_group("two_host_co_run")  # shares the reference run with test_loopback
def test_kill_9_of_a_two_host_co_run_resumes_on_two_hosts(tmp_path, two_host_co_run):
    _kill_and_resume(tmp_path, two_host_co_run.run_dir, ["hardware.hosts=2"])


STOP_WITHIN_S = 30.0  # a checkpoint of the last step, then every host process gone


@pytest.mark.slow
def test_sigterm_checkpoints_the_last_step_and_says_how_to_resume(tmp_path):
    run_dir = tmp_path / "run"
    run = start(run_dir, [*RESUMABLE, "checkpoint_every_steps=0", "eval_every_steps=0"])
    _wait_for_steps(run, run_dir, 2)
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
    done = len(_steps(run_dir))
    saved = [int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()]
    assert saved == [done] and 2 <= done < STEPS


@pytest.mark.slow
def test_a_finished_run_started_again_trains_nothing(tmp_path, one_host_reference):
    run_dir = tmp_path / "run"
    shutil.copytree(one_host_reference, run_dir)
    before = (run_dir / "metrics.jsonl").read_text()
    output = run_through(run_dir, RESUMABLE)
    assert "nothing to train" in output
    assert (run_dir / "metrics.jsonl").read_text() == before
