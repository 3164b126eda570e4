"""tools/suite_cpu.py names each process of a test run by its kind (command lines as /proc
showed them during a suite run), and its sampler counts a child it did not wait for."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = "/root/.pyenv/versions/3.11.7/bin/python"
SITE = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages"


@pytest.fixture
def suite_cpu(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    import suite_cpu  # noqa: PLC0415

    return suite_cpu


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (f"{PYTHON} -u -c import sys;exec(eval(sys.stdin.readline())) ", "pytest-xdist worker"),
        (f"{PYTHON} -m locoexp.compiled.worker 4 ", "XLA-TPU compile child"),
        (
            f"{PYTHON} -B -c from multiprocessing.spawn import spawn_main; "
            "spawn_main(tracker_fd=14, pipe_handle=25) --multiprocessing-fork ",
            "co / single-controller host",
        ),
        (f"{PYTHON} {SITE}/ray/_private/workers/setup_worker.py {SITE}/ray/_priv", "Ray actor"),
        ("ray::RolloutHost.evaluate ", "Ray actor"),
        ("gcs_server --log_dir=/tmp/ray/session_2026-12-07_18-15-07_143487_25836/ ", "Ray daemon"),
        (f"{PYTHON} -u {SITE}/ray/_private/log_monitor.py --session-dir=/tmp/ray/s", "Ray daemon"),
        (f"{PYTHON} {SITE}/ray/dashboard/dashboard.py --host=127.0.0.1 ", "Ray daemon"),
        (f"{PYTHON} -I /work/main/locoexp/placement/ray/watchdog.py 1 2", "Ray watchdog"),
        (f"{PYTHON} run.py logger=none seed=0 steps=4 ", "python run.py"),
        (f"{PYTHON} /work/main/tests/moe_ep_worker.py /tmp/ep0/results.npz ", "test worker"),
        ("", "other: (kernel thread)"),
    ],
)
def test_each_process_of_a_suite_run_is_named_by_its_kind(suite_cpu, cmdline, kind):
    assert suite_cpu.kind(cmdline).startswith(kind)


def test_the_sampler_counts_a_child_it_did_not_start(suite_cpu):
    """A process the sampler never waited for (as Ray's are): its CPU is counted from /proc."""
    sampler = suite_cpu.Sampler(interval_s=0.05)
    sampler.thread.start()
    # 0.5 s of CPU, then a pause while it is alive, so that the last sample sees all of it
    spin = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    spin += "\ntime.sleep(0.5)"
    child = subprocess.Popen([sys.executable, "-c", spin])
    assert child.wait(timeout=120) == 0
    sampler.stop.set()
    sampler.thread.join()
    first, last, cmdline, before = sampler.seen[str(child.pid)]
    assert not before and "process_time" in cmdline
    assert first == 0.0 and last >= 0.5  # counted from its start: all its CPU
