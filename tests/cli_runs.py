"""Test helpers: `python run.py` as a user starts it, in its own process group, with a deadline
that fails the test at once, and the listening sockets of its own process tree (psutil), which
must all be on loopback (README, "Security")."""

import contextlib
import dataclasses
import ipaddress
import json
import os
import random
import signal
import subprocess
import sys
import threading
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
    "dataset.synthetic.held_out_size=16",
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


@contextlib.contextmanager
def sockets_of(run: subprocess.Popen, every_s: float = 0.25):
    """Yields a dict that fills, while the block runs, with every listening socket of the run's
    process tree, listed every `every_s` by a background thread until the run ends."""
    seen: dict[tuple[str, int], str] = {}
    done = threading.Event()

    def watch() -> None:
        root = psutil.Process(run.pid)
        while not done.is_set() and run.poll() is None:
            seen.update(listening(root))
            done.wait(every_s)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


# Components the README's security note names as listening beyond loopback (none today).
ALLOWED_BEYOND_LOOPBACK: set[str] = set()


def assert_loopback_only(sockets: dict[tuple[str, int], str]) -> None:
    """Some listening socket was seen, and every one is on loopback (or an allowed component)."""
    assert sockets, "no listening socket was seen: the watch missed the run"
    beyond = {
        f"{name} on {ip}:{port}" for (ip, port), name in sockets.items() if not _is_loopback(ip)
    }
    assert {b.split(" on ")[0] for b in beyond} <= ALLOWED_BEYOND_LOOPBACK, sorted(beyond)


@dataclasses.dataclass(frozen=True)
class WatchedRun:
    run_dir: Path
    output: str
    sockets: dict[tuple[str, int], str]  # every listening socket seen while it ran


def assert_same_steps(got: list[dict], want: list[dict], steps: int) -> None:
    """Every step exactly once, with the reference run's losses and rewards (within 1e-5)."""
    assert [r["step"] for r in got] == list(range(steps))
    for a, b in zip(got, want, strict=True):
        for key in ("train/loss", "rollout/reward_mean"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), (a["step"], key)


def records(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl records (its last line only once written whole)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def step_records(run_dir: Path) -> list[dict]:
    return [r for r in records(run_dir) if "eval/accuracy" not in r]


def _checkpointed(run_dir: Path) -> bool:
    directory = run_dir / "checkpoints"
    return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


def wait_for_steps(
    run: subprocess.Popen, run_dir: Path, count: int, *, checkpoint: bool = False
) -> None:
    """Until `count` steps are logged (and, with `checkpoint`, one is saved); a run that ends
    first, or a deadline missed, fails the test at once."""
    begun = time.monotonic()
    while len(step_records(run_dir)) < count or (checkpoint and not _checkpointed(run_dir)):
        if run.poll() is not None:
            pytest.fail(f"the run ended before step {count}: {finish(run)[-2000:]}")
        if time.monotonic() - begun > DEADLINE_S:
            kill(run)
            pytest.fail(f"no step {count} within {DEADLINE_S} s")
        time.sleep(0.05)


@dataclasses.dataclass(frozen=True)
class KilledRun(WatchedRun):
    args: list[str]  # the command's overrides (hydra.run.dir apart)
    steps_at_kill: int  # steps logged when SIGKILL landed


def kill_and_resume(run_dir: Path, args: list[str], *, steps: int) -> KilledRun:
    """`python run.py <args>` killed with SIGKILL once it has logged a random step (between 1
    and `steps` - 2) and saved a checkpoint, then the same command to the end; every listening
    socket of both attempts' process trees is seen."""
    run = start(run_dir, args)
    with sockets_of(run) as seen:
        wait_for_steps(run, run_dir, random.randint(1, steps - 2), checkpoint=True)
        kill(run)
    killed_at = len(step_records(run_dir))
    run = start(run_dir, args)
    with sockets_of(run) as seen_again:
        output = finish(run)
    assert run.returncode == 0, output[-3000:]
    return KilledRun(run_dir, output, {**seen, **seen_again}, args, killed_at)
