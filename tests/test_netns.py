"""Runs that span machines, on machines made of network namespaces (`tests/support/netns.py`):
two namespaces joined by a bridge, 10.77.0.1 and 10.77.0.2, each process seeing only its own
machine's interfaces.

- `co`: one host process per machine, each started with the command every host of a cluster
  runs (`hardware.coordinator_address` at the first machine, `hardware.process_id`,
  `hardware.bind_address` = the machine's address); the run's per-step losses and rewards equal
  those of the same job on local processes (test_step_loop's `co_2hosts` records, which that
  module holds the local run to), and every socket it listens on is on a machine's address or
  loopback.
- `da`: a Ray cluster across the machines (`ray start --head` on the first, a worker node on the
  second), given by `placement.ray_address`; the rollout host lands on the worker node, which is
  then lost whole (every process of its namespace SIGKILLed) after the first trained step. Ray
  restarts the rollout host on the head node, the lost batch is regenerated, and the run trains
  every step once with the local da run's losses (`da_2hosts`). Ray's own servers listen on all
  interfaces on a cluster (Ray binds 127.0.0.1 or 0.0.0.0, nothing between): the test holds
  every wildcard listener to exactly those Ray components (README, "Security").

Skipped with one line where network namespaces cannot be made (not root). Every wait has a
deadline that fails the test at once; everything a test started lives in its namespaces and is
killed with them.
"""

import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from cli_runs import assert_same_steps, step_records
from step_loop_reference import golden_steps, overrides_of
from support.netns import Listener, Machine, machines, unavailable

from locoexp.metrics.run_records import read_metrics_jsonl

if (reason := unavailable()) is not None:
    pytest.skip(reason, allow_module_level=True)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
# A test's runs, compiles and Ray start-up included, on a loaded 2-core machine (an unloaded one
# takes about a third); past it the test fails at once, below pytest's own timeout (900 s)
DEADLINE_S = 780
RAY_START_S = 240  # one `ray start` on a loaded machine
COORDINATOR_PORT = 8476
RAY_PORT = 6379
WORKER_PORTS = (20000, 20999)  # Ray's core workers (the driver's and each actor's gRPC server)
STEPS = 4  # the recorded runs' steps (their learning-rate schedule spans them)


def assert_reference_records(run_dir: Path, name: str) -> None:
    assert_same_steps(step_records(run_dir), golden_steps(name), STEPS)


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
    return ""


class Watch:
    """Every listener and process seen in the machines, polled while a run goes on."""

    def __init__(self, machines_: list[Machine]):
        self.machines, self.start = machines_, time.monotonic()
        self.listeners: dict[tuple[str, Listener], str] = {}
        self.processes: dict[str, set[str]] = {m.name: set() for m in machines_}

    def poll(self) -> None:
        for machine in self.machines:
            for pid in machine.pids():
                self.processes[machine.name].add(cmdline(pid).split(" ")[0])
            for listener in machine.listeners():
                self.listeners[(machine.address, listener)] = cmdline(listener.pid)

    def ran(self, machine: Machine, actor: str) -> bool:
        """Whether a process of Ray actor class `actor` ran in `machine` (`ray::Class[.method]`)."""
        return any(p.split(".")[0] == f"ray::{actor}" for p in self.processes[machine.name])

    def until(self, done, *, what: str) -> None:
        """Poll until `done()`; past DEADLINE_S from the watch's start the test fails."""
        while not done():
            if time.monotonic() - self.start > DEADLINE_S:
                pytest.fail(f"{what}: not within {DEADLINE_S} s of the test's start")
            self.poll()
            time.sleep(0.2)

    def outside(self, *, ray: bool) -> list[str]:
        """Listeners on neither their machine's address nor loopback (Ray's wildcard servers
        excepted when `ray`)."""
        bad = []
        for (address, listener), command in self.listeners.items():
            ip = listener.ip.removeprefix("::ffff:")
            if ip in (address, "127.0.0.1", "::1"):
                continue
            if ray and is_ray_server(listener, command):
                continue
            bad.append(f"{address}: {listener} {command[:80]}")
        return bad


def is_ray_server(listener: Listener, command: str) -> bool:
    """Ray's gRPC servers, which Ray binds to 0.0.0.0 on any node address but 127.0.0.1: the
    GCS, each raylet (node and object manager), each core worker (the driver's and every
    actor's, in the worker port range given to `ray start`), and the autoscaler monitor's
    metrics server (`ray/autoscaler/_private/monitor.py`: 0.0.0.0 unless the head is local)."""
    if listener.process in ("gcs_server", "raylet"):
        return True
    if "autoscaler/_private/monitor.py" in command:
        return True
    return WORKER_PORTS[0] <= listener.port <= WORKER_PORTS[1]


def start_run(machine: Machine, args: list[str], out: Path, env: dict) -> subprocess.Popen:
    command = [sys.executable, "run.py", *args]
    with open(out, "wb") as log:
        return machine.popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def finished(runs: list[subprocess.Popen]):
    return lambda: all(r.poll() is not None for r in runs)


def test_co_hosts_on_two_machines_train_the_local_runs_steps_on_their_addresses(tmp_path):
    run_dir = tmp_path / "run"
    with machines(2) as pair:
        head = pair[0].address
        runs = [
            start_run(
                machine,
                [
                    *overrides_of("co_2hosts"),
                    f"hardware.coordinator_address={head}:{COORDINATOR_PORT}",
                    f"hardware.process_id={index}",
                    f"hardware.bind_address={machine.address}",
                    f"hydra.run.dir={run_dir}",
                ],
                tmp_path / f"host{index}.out",
                dict(os.environ),
            )
            for index, machine in enumerate(pair)
        ]
        watch = Watch(pair)
        watch.until(finished(runs), what="the 2-host co run")
    outputs = [(tmp_path / f"host{i}.out").read_text()[-3000:] for i in range(2)]
    assert [r.returncode for r in runs] == [0, 0], outputs
    assert_reference_records(run_dir, "co_2hosts")
    coordinator = [k for k in watch.listeners if k[1].port == COORDINATOR_PORT]
    # one socket, seen once per process holding it (a forked child inherits it): its addresses
    assert {(a, listener.ip.removeprefix("::ffff:")) for a, listener in coordinator} == {
        (head, head)
    }
    wildcard = watch.outside(ray=False)
    assert not wildcard, wildcard


# Ray's command line (the `ray` script's entry point) run by this interpreter: the Ray the run
# imports, found without the virtualenv's bin on PATH (a bare `ray` needs it there)
RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]


def ray_start(machine: Machine, args: list[str], root: Path, env: dict) -> None:
    """`ray start` in `machine`, tried three times: a raylet waits a fixed 15 s for its dashboard
    agent's port file (Ray's `WaitForPersistedPort`), which a loaded machine can miss."""
    ports = [f"--min-worker-port={WORKER_PORTS[0]}", f"--max-worker-port={WORKER_PORTS[1]}"]
    command = [*RAY_CLI, "start", f"--node-ip-address={machine.address}", *args, *ports]
    command += [f"--temp-dir={root / machine.name}", "--disable-usage-stats"]
    command += ["--include-dashboard=false"] if "--head" in args else []  # as a local run
    for _ in range(3):
        started = machine.run(command, timeout_s=RAY_START_S, env=env, capture_output=True)
        if started.returncode == 0:
            return
        machine.kill_all()  # what the failed start left
    pytest.fail(f"ray start {args}: {started.stderr.decode()[-2000:]}")


def ray_environment() -> dict:
    """The cluster's token (Ray's token authentication, shared by every node as a cluster shares
    it). Ray's own health checks (3 s x 5) find the lost node: quicker ones fail a raylet still
    starting on a loaded machine."""
    return {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def trained_steps(run_dir: Path) -> list[int]:
    path = run_dir / "batches.jsonl"
    rows = read_metrics_jsonl(path) if path.exists() else []
    return [row["step"] for row in rows if "example_ids" in row]


def test_da_on_a_ray_cluster_across_machines_survives_the_loss_of_the_rollout_node(tmp_path):
    run_dir, env = tmp_path / "run", ray_environment()
    ray_root = tempfile.TemporaryDirectory(prefix="lxray", ignore_cleanup_errors=True)
    with ray_root as root, machines(2) as (head, worker):  # Ray's socket paths stay short
        address = f"{head.address}:{RAY_PORT}"
        # 2 CPUs on the head: the trainer host, and the rollout host once its node is lost
        ray_start(head, ["--head", f"--port={RAY_PORT}", "--num-cpus=2"], Path(root), env)
        ray_start(worker, [f"--address={address}", "--num-cpus=1"], Path(root), env)
        run = start_run(
            head,
            [
                *overrides_of("da_2hosts"),
                "checkpoint_every_steps=2",
                f"placement.ray_address={address}",
                f"hardware.bind_address={head.address}",
                f"hydra.run.dir={run_dir}",
            ],
            tmp_path / "driver.out",
            env,
        )
        watch = Watch([head, worker])
        watch.until(
            lambda: watch.ran(worker, "RolloutHost") and trained_steps(run_dir),
            what="step 0 of the da run, its rollout host on the worker node",
        )
        assert watch.ran(head, "TrainerHost") and not watch.ran(head, "RolloutHost")
        assert worker.kill_all(), "nothing ran on the worker node"
        watch.until(finished([run]), what="the da run after its rollout node was lost")
    output = (tmp_path / "driver.out").read_text()
    assert run.returncode == 0, output[-3000:]
    assert watch.ran(head, "RolloutHost")  # restarted on the surviving node
    assert trained_steps(run_dir) == list(range(STEPS))
    rows = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    restarts = [row for row in rows if row.get("event") == "rollout_restart"]
    assert len(restarts) == 1 and restarts[0]["host"] == 0, restarts
    assert_reference_records(run_dir, "da_2hosts")
    wildcard = watch.outside(ray=True)
    assert not wildcard, wildcard
