"""Machines for tests of runs that span machines: Linux network namespaces joined by a bridge.

`machines(count)` makes `count` network namespaces (root only; `ip netns`), each joined to one
bridge in the root namespace by a veth pair and given its own address (10.77.0.1/24,
10.77.0.2/24, ...), with loopback up; its `/etc/netns/<name>/hosts` maps this machine's host name
to that address, as a cluster's DNS does for a real machine (`ip netns exec` mounts it over
`/etc/hosts`: JAX's gloo collectives listen on the address the host name resolves to). A process
started with `Machine.popen` sees only its namespace's interfaces, so a run whose hosts are
spread over the machines talks over the bridge exactly as it would over a cluster network.

Everything is removed on exit, also when the test fails: every process left in a namespace is
killed (SIGKILL), then the namespaces, links, bridge and hosts files go. Names carry this
process's id and a random tag, so parallel test workers and leftovers of a killed run never
clash. This module must not import jax or Ray: it is the tests' machinery, not the run's.
"""

import contextlib
import dataclasses
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

NETNS_ETC = Path("/etc/netns")
SUBNET = "10.77.0"  # each set of machines has its own bridge: the same addresses never meet
COMMAND_TIMEOUT_S = 10.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, check=check, timeout=COMMAND_TIMEOUT_S
    )


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (one line), or None when they can."""
    name = f"lxprobe{os.getpid()}"
    try:
        made = _ip("netns", "add", name, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"network namespaces are unavailable ({error})"
    if made.returncode != 0:
        return f"cannot make a network namespace (`ip netns add`: {made.stderr.strip()}; root?)"
    _ip("netns", "del", name, check=False)
    return None


@dataclasses.dataclass(frozen=True)
class Listener:
    ip: str
    port: int
    pid: int
    process: str


@dataclasses.dataclass(frozen=True)
class Machine:
    """One network namespace standing in for a machine with `address` on the cluster network."""

    name: str
    address: str

    def command(self, args: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *args]

    def popen(self, args: list[str], **kwargs) -> subprocess.Popen:
        """`args` started in this machine (in its own session: signals reach only it)."""
        return subprocess.Popen(self.command(args), start_new_session=True, **kwargs)

    def run(self, args: list[str], *, timeout_s: float, **kwargs) -> subprocess.CompletedProcess:
        """`args` run to completion in this machine; past `timeout_s` it is killed and raises."""
        return subprocess.run(self.command(args), timeout=timeout_s, **kwargs)

    def pids(self) -> list[int]:
        """Every process in this machine's namespace (all started by the test that made it)."""
        found = _ip("netns", "pids", self.name, check=False).stdout.split()
        return [int(pid) for pid in found]

    def kill_all(self) -> list[int]:
        """SIGKILL every process in this machine (a machine lost at once); returns their ids."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def listeners(self) -> list[Listener]:
        """Every listening TCP socket in this machine (`ss -ltnp` inside its namespace)."""
        shown = self.run(["ss", "-ltnpH"], timeout_s=COMMAND_TIMEOUT_S, capture_output=True)
        found = []
        for line in shown.stdout.decode().splitlines():
            fields = line.split()
            if len(fields) < 4:
                continue
            ip, _, port = fields[3].rpartition(":")
            owners = fields[5].split("),(") if len(fields) > 5 else ["?"]
            for owner in owners:
                process, pid = _ss_owner(owner)
                found.append(Listener(ip.strip("[]"), int(port), pid, process))
        return found


def _ss_owner(field: str) -> tuple[str, int]:
    """`users:(("raylet",pid=12,fd=3))` -> ("raylet", 12)."""
    name = field.split('"')[1] if '"' in field else "?"
    pid = field.split("pid=")[1].split(",")[0] if "pid=" in field else "0"
    return name, int(pid)


@contextlib.contextmanager
def machines(count: int) -> Iterator[list[Machine]]:
    """`count` machines on one bridge (module docstring); everything removed on exit."""
    tag = f"lx{os.getpid() % 4096:03x}{secrets.token_hex(2)}"  # <= 9 chars: links take 15
    made = [Machine(name=f"{tag}m{i}", address=f"{SUBNET}.{i + 1}") for i in range(count)]
    bridge = f"{tag}br"
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "up")
        for i, machine in enumerate(made):
            _join(machine, bridge=bridge, veth=f"{tag}v{i}")
        yield made
    finally:
        _remove(made, bridge=bridge, tag=tag)


def _join(machine: Machine, *, bridge: str, veth: str) -> None:
    """The namespace, its end of a veth pair with the address, loopback, its hosts file."""
    inside = f"{veth}p"
    _ip("netns", "add", machine.name)
    _ip("link", "add", veth, "type", "veth", "peer", "name", inside)
    _ip("link", "set", inside, "netns", machine.name)
    _ip("link", "set", veth, "master", bridge)
    _ip("link", "set", veth, "up")
    for args in (
        ["addr", "add", f"{machine.address}/24", "dev", inside],
        ["link", "set", inside, "up"],
        ["link", "set", "lo", "up"],
    ):
        _ip("-n", machine.name, *args)
    etc = NETNS_ETC / machine.name
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(f"127.0.0.1 localhost\n{machine.address} {socket.gethostname()}\n")


def _remove(made: list[Machine], *, bridge: str, tag: str) -> None:
    """Kill what runs in each namespace, then remove namespaces, links and hosts files."""
    for machine in made:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            machine.kill_all()
    time.sleep(0.2)  # the kernel reaps the killed processes before their namespace goes
    for machine in made:
        _ip("netns", "del", machine.name, check=False)
        with contextlib.suppress(OSError):
            (NETNS_ETC / machine.name / "hosts").unlink()
            (NETNS_ETC / machine.name).rmdir()
    for i in range(len(made)):
        _ip("link", "del", f"{tag}v{i}", check=False)
    _ip("link", "del", bridge, check=False)
