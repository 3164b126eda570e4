"""The watchdog of a run's local Ray cluster: once the driver that started it is gone, no process
of that cluster outlives it (issue 31). Linux only (it reads /proc); imports neither jax nor Ray.

Why Ray's own teardown is not enough after a SIGKILLed driver: Ray ties its node's processes
(gcs_server, raylet, the monitors) to the driver with PR_SET_PDEATHSIG
(`ray._private.services.start_ray_process(fate_share=True)`), and the actors exit a second or
two after their raylet; but the raylet's dashboard and runtime-env agents, which notice their
raylet's death at once, then publish its error to the dead GCS with a fixed 60 s timeout
(`ray._private.utils.publish_error_to_driver`, called by `process_watcher`) and stay about a
minute. Ray's reaper (`ray_process_reaper.py`: EOF on its stdin, then SIGTERM and SIGKILL to its
process group) runs only where the kernel cannot fate-share, and a process group would both miss
the actors (each leads its own) and take unrelated processes of the driver's group. `ray stop`
kills by process name across the machine, other runs' and users' Ray included.

So this watchdog waits as Ray's reaper does (EOF on its stdin, whose other end only the driver
holds: its exit or its death; or a changed parent, the driver's death), then stops exactly the
processes of its cluster: those writing into the cluster's session directory
(`/tmp/ray/session_<time>_<driver pid>`, unique to the cluster), where Ray sends every
process's log (its gcs_server, raylet, monitors, agents and workers alike). A process reading
there (`tail -f raylet.out`) is not the cluster's, nor is the driver (it holds its own log
there). SIGTERM first, SIGKILL after a grace period, as `ray stop` does.

Started by `session.watchdog` as `python watchdog.py <session dir> <driver pid>`.
"""

import contextlib
import os
import select
import sys
import time

import psutil

GRACE_S = 3.0  # SIGTERM to SIGKILL, as `ray stop --grace-period`
_WRITING = os.O_WRONLY | os.O_RDWR


def writes_under(pid: int, directory: str) -> bool:
    """Whether process `pid` holds a file under `directory` open for writing."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or another user's
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith(directory + os.sep):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                flags = next(line for line in info if line.startswith("flags:"))
            if int(flags.split()[1], 8) & _WRITING:
                return True
    return False


def cluster_processes(session_dir: str, driver_pid: int) -> list[psutil.Process]:
    """The live processes writing into `session_dir`, other than the driver and this one."""
    found = []
    for pid in psutil.pids():
        if pid in (os.getpid(), driver_pid):
            continue
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)  # holds its start time: a reused pid is never signalled
            if writes_under(pid, session_dir):
                found.append(process)
    return found


def stop_cluster(session_dir: str, driver_pid: int, grace_s: float = GRACE_S) -> list:
    """SIGTERM every process of the cluster, SIGKILL those left after `grace_s`; returns them."""
    processes = cluster_processes(session_dir, driver_pid)
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    for process in _running_after(processes, grace_s):
        with contextlib.suppress(psutil.Error):
            process.kill()
    _running_after(processes, grace_s)
    return processes


def _running_after(processes: list[psutil.Process], wait_s: float) -> list[psutil.Process]:
    """Those of `processes` still running after up to `wait_s`. A zombie has ended (an orphan's
    is reaped by init, which in a container may never do it)."""
    deadline = time.monotonic() + wait_s
    while True:
        running = []
        for process in processes:
            with contextlib.suppress(psutil.Error):
                if process.status() != psutil.STATUS_ZOMBIE:
                    running.append(process)
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def wait_for_driver(driver_pid: int, poll_s: float = 1.0) -> None:
    """Until the driver closes this process's stdin, or dies (EOF, or a new parent)."""
    stdin = sys.stdin.fileno()
    while os.getppid() == driver_pid:
        ready, _, _ = select.select([stdin], [], [], poll_s)
        if ready and not os.read(stdin, 4096):
            return


if __name__ == "__main__":
    session_dir, driver_pid = os.path.realpath(sys.argv[1]), int(sys.argv[2])
    wait_for_driver(driver_pid)
    stop_cluster(session_dir, driver_pid)
