"""Every socket a local run listens on is on loopback (README, "Security"): the listening sockets
of a 2-host `co` run and a `da` run, listed with psutil over the run's own process tree while it
runs."""

import ipaddress

import pytest
from cli_runs import WatchedRun, run_and_watch

# Components the README's security note names as listening beyond loopback (none today).
ALLOWED_BEYOND_LOOPBACK: set[str] = set()


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _assert_loopback_only(run: WatchedRun) -> None:
    seen = run.sockets
    assert seen, "no listening socket was seen: the watch missed the run"
    beyond = {f"{name} on {ip}:{port}" for (ip, port), name in seen.items() if not _is_loopback(ip)}
    assert {b.split(" on ")[0] for b in beyond} <= ALLOWED_BEYOND_LOOPBACK, sorted(beyond)


@pytest.mark.slow
@pytest.mark.xdist_group("two_host_co_run")  # the run test_resume_run takes as its reference
def test_a_two_host_co_run_listens_on_loopback_only(two_host_co_run):
    _assert_loopback_only(two_host_co_run)


@pytest.mark.slow
def test_a_da_run_listens_on_loopback_only(tmp_path):
    run = run_and_watch(
        tmp_path / "run",
        ["placement=da", "hardware.hosts=2", "split=0.5", "steps=4", "dataset.prompts_per_step=4"]
        + ["logger=none"],
        deadline_s=500,
    )
    names = set(run.sockets.values())
    assert {"gcs_server", "raylet"} <= names, names  # the watch saw Ray's own services
    _assert_loopback_only(run)
