"""Test helpers: `python run.py` as a user starts it, in its own process group, with a deadline
that fails the test at once, and the listening sockets of its own process tree (psutil)."""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 420  # one run on a 2-core machine; a run past it fails the test at once
STEPS = 8
# A resumable run: checkpoints every 2 steps, evaluations after steps 3 and 7.
RESUMABLE = [
    f"steps={STEPS}",
    "checkpoint_every_steps=2",
    "eval_every_steps=4",
    "logger=none",
    "dataset.prompts_per_step=8",
    "dataset.samples_per_prompt=4",
    "dataset.synthetic.eval_size=16",
]


def _output_file(run: subprocess.Popen) -> Path:
    return Path(run.args[-1].removeprefix("hydra.run.dir=") + ".out")


def start(run_dir: Path, args: list[str]) -> subprocess.Popen:
    """Start `python run.py <args>`; its output goes to `<run_dir>.out` (a file, not a pipe
    that fills while the test watches), appended across restarts of the same run."""
    command = [sys.executable, "run.py", *args, f"hydra.run.dir={run_dir}"]
    with open(f"{run_dir}.out", "ab") as out:
        offset = out.seek(0, os.SEEK_END)  # before the run writes
        run = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the test signals only what it started
        )
    run.output_offset = offset
    return run


def kill(run: subprocess.Popen) -> None:
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()


def finish(run: subprocess.Popen, timeout_s: float = DEADLINE_S) -> str:
    """Wait for the run; its output since it started (earlier attempts' output excluded)."""
    try:
        run.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill(run)
        pytest.fail(f"the run did not finish within {timeout_s} s")
    return _output_file(run).read_bytes()[run.output_offset :].decode(errors="replace")


def run_through(run_dir: Path, args: list[str]) -> str:
    run = start(run_dir, args)
    output = finish(run)
    assert run.returncode == 0, output[-3000:]
    return output


def listening(root: psutil.Process) -> dict[tuple[str, int], str]:
    """(ip, port) -> process name, for every listening TCP socket of `root` and its children."""
    found = {}
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return found
    for process in processes:
        try:
            name = process.name()
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found[(conn.laddr.ip, conn.laddr.port)] = name
        except psutil.Error:
            continue
    return found


@dataclasses.dataclass(frozen=True)
class WatchedRun:
    run_dir: Path
    output: str
    sockets: dict[tuple[str, int], str]  # every listening socket seen while it ran


def run_and_watch(run_dir: Path, args: list[str], *, deadline_s: float) -> WatchedRun:
    """Run to the end, listing the listening sockets of the run's process tree every 0.25 s."""
    run = start(run_dir, args)
    root, seen, begun = psutil.Process(run.pid), {}, time.monotonic()
    try:
        while run.poll() is None:
            if time.monotonic() - begun > deadline_s:
                pytest.fail(f"the run did not finish within {deadline_s} s")
            seen |= listening(root)
            time.sleep(0.25)
    finally:
        if run.poll() is None:
            kill(run)
    output = finish(run, timeout_s=60)
    assert run.returncode == 0, output[-3000:]
    return WatchedRun(run_dir, output, seen)


def assert_same_steps(got: list[dict], want: list[dict], steps: int) -> None:
    """Every step exactly once, with the reference run's losses and rewards (within 1e-5)."""
    assert [r["step"] for r in got] == list(range(steps))
    for a, b in zip(got, want, strict=True):
        for key in ("train/loss", "rollout/reward_mean"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), (a["step"], key)
