"""Runs that survive, with real processes (`python run.py`): kill -9 at a random step and the
same command again gives every step once with the uninterrupted run's losses and rewards (1 and 2
hosts); SIGTERM stops cleanly with a checkpoint and a resume line; a finished run started again
trains nothing."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STEPS = 8
RUN = [
    f"steps={STEPS}",
    "checkpoint_every_steps=2",
    "eval_every_steps=4",
    "logger=none",
    "dataset.prompts_per_step=8",
    "dataset.samples_per_prompt=4",
    "dataset.synthetic.eval_size=16",
]
DEADLINE_S = 420  # one run on this 2-core machine; a run past it fails the test at once


def _start(run_dir: Path, extra: list[str]) -> subprocess.Popen:
    command = [sys.executable, "run.py", *RUN, *extra, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the test signals only what it started
    )


def _finish(run: subprocess.Popen, timeout_s: float = DEADLINE_S) -> str:
    try:
        output = run.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
        pytest.fail(f"the run did not finish within {timeout_s} s")
    return output.decode(errors="replace")


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
    start = time.monotonic()
    while len(_steps(run_dir)) < count or (checkpoint and not _checkpointed(run_dir)):
        if run.poll() is not None:
            pytest.fail(f"the run ended before step {count}: {_finish(run)[-2000:]}")
        if time.monotonic() - start > DEADLINE_S:
            os.killpg(run.pid, signal.SIGKILL)
            pytest.fail(f"no step {count} within {DEADLINE_S} s")
        time.sleep(0.05)


def _run_through(run_dir: Path, extra: list[str]) -> str:
    run = _start(run_dir, extra)
    output = _finish(run)
    assert run.returncode == 0, output[-3000:]
    return output


def _assert_same_steps(resumed: Path, reference: Path) -> None:
    got, want = _steps(resumed), _steps(reference)
    assert [r["step"] for r in got] == list(range(STEPS))  # every step exactly once
    for a, b in zip(got, want, strict=True):
        for key in ("train/loss", "rollout/reward_mean"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), (a["step"], key)
    assert [r["step"] for r in _records(resumed) if "eval/accuracy" in r] == [3, 7]


def _kill_and_resume(tmp_path: Path, extra: list[str]) -> None:
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    _run_through(reference, extra)
    kill_after = random.randint(3, STEPS - 2)  # steps logged when kill -9 lands
    run = _start(resumed, extra)
    _wait_for_steps(run, resumed, kill_after, checkpoint=True)
    os.killpg(run.pid, signal.SIGKILL)
    run.communicate()
    assert len(_steps(resumed)) < STEPS, "the run finished before the kill"
    _run_through(resumed, extra)
    _assert_same_steps(resumed, reference)
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["resume/attempts"] == 2
    assert (resumed / "policy" / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_kill_9_then_the_same_command_gives_the_uninterrupted_run(tmp_path):
    _kill_and_resume(tmp_path, [])


@pytest.mark.slow
def test_kill_9_of_a_two_host_co_run_resumes_on_two_hosts(tmp_path):
    _kill_and_resume(tmp_path, ["hardware.hosts=2"])


@pytest.mark.slow
def test_sigterm_checkpoints_the_last_step_and_says_how_to_resume(tmp_path):
    run_dir = tmp_path / "run"
    run = _start(run_dir, ["checkpoint_every_steps=0", "eval_every_steps=0"])
    _wait_for_steps(run, run_dir, 2)
    sent = time.monotonic()
    os.killpg(run.pid, signal.SIGTERM)
    output = _finish(run, timeout_s=60)
    assert time.monotonic() - sent < 5.0, "the stop took 5 s or more"
    assert run.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if "resume with:" in line]
    assert len(lines) == 1 and f"hydra.run.dir={run_dir}" in lines[0], output[-2000:]
    done = len(_steps(run_dir))
    saved = [int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()]
    assert saved == [done] and 2 <= done < STEPS


@pytest.mark.slow
def test_a_finished_run_started_again_trains_nothing(tmp_path):
    run_dir = tmp_path / "run"
    _run_through(run_dir, [])
    before = (run_dir / "metrics.jsonl").read_text()
    output = _run_through(run_dir, [])
    assert "nothing to train" in output
    assert (run_dir / "metrics.jsonl").read_text() == before
