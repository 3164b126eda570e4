"""Every socket a local run listens on is on loopback (README, "Security"): the listening sockets
of a 2-host `co` run and a `da` run, listed with psutil over the run's own process tree while it
runs."""

import ipaddress
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
# Components the README's security note names as listening beyond loopback (none today).
ALLOWED_BEYOND_LOOPBACK: set[str] = set()


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _listening(root: psutil.Process) -> dict[tuple[str, int], str]:
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


def _run_and_watch(overrides: list[str], run_dir: Path, *, deadline_s: float) -> dict:
    command = [sys.executable, "run.py", *overrides, f"hydra.run.dir={run_dir}", "logger=none"]
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    root, seen, start = psutil.Process(run.pid), {}, time.monotonic()
    try:
        while run.poll() is None:
            if time.monotonic() - start > deadline_s:
                pytest.fail(f"the run did not finish within {deadline_s} s")
            seen |= _listening(root)
            time.sleep(0.25)
    finally:
        if run.poll() is None:
            run.kill()
        output = run.communicate()[0].decode(errors="replace")
    assert run.returncode == 0, output[-3000:]
    return seen


def _assert_loopback_only(seen: dict) -> None:
    assert seen, "no listening socket was seen: the watch missed the run"
    beyond = {f"{name} on {ip}:{port}" for (ip, port), name in seen.items() if not _is_loopback(ip)}
    assert {b.split(" on ")[0] for b in beyond} <= ALLOWED_BEYOND_LOOPBACK, sorted(beyond)


@pytest.mark.slow
def test_a_two_host_co_run_listens_on_loopback_only(tmp_path):
    seen = _run_and_watch(
        ["placement=co", "hardware.hosts=2", "steps=4", "dataset.prompts_per_step=4"],
        tmp_path / "run",
        deadline_s=400,
    )
    _assert_loopback_only(seen)


@pytest.mark.slow
def test_a_da_run_listens_on_loopback_only(tmp_path):
    seen = _run_and_watch(
        ["placement=da", "hardware.hosts=2", "split=0.5", "steps=4", "dataset.prompts_per_step=4"],
        tmp_path / "run",
        deadline_s=500,
    )
    names = set(seen.values())
    assert {"gcs_server", "raylet"} <= names, names  # the watch saw Ray's own services
    _assert_loopback_only(seen)
