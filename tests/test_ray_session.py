"""The run's own Ray (`locoexp.placement.ray.session`, issue 31): a local cluster's loopback
switch does not outlive its start (a later joined-cluster run in the same process sees Ray's
multi-node default), its watchdog stops exactly the cluster's processes, and after a SIGKILL of
a `da` driver no process of its Ray is left after a bounded wait (Ray alone leaves its
dashboard and runtime-env agents for about a minute: experiments/LOG.md, session 14). A trainer
host reports a checkpoint that failed in the background before its next step, and its sentence
reaches the driver as it is.

Each test looks only at processes it started: the driver's descendants, listed before it is
killed, and any process carrying this test's `LOCOEXP_TEST_OWNER` marker. The marker is read
from /proc raw: Ray's agents retitle themselves (setproctitle), which blanks the head of their
environment block, and psutil's `environ()` stops at the first blank entry."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from cli_runs import assert_loopback_only
from step_loop_reference import overrides_of

from locoexp.errors import ConfigError
from locoexp.layout import Layout, PlacementKind, TransportKind
from locoexp.placement.coordinator import CoordinatorSpec
from locoexp.placement.ray.hosts import TrainerHost
from locoexp.placement.ray.session import keep_ray_on_loopback, ray_session, watchdog
from locoexp.placement.ray.spec import RaySpec
from locoexp.placement.ray.transport import RayActors
from locoexp.placement.ray.watchdog import cluster_processes

REPO = Path(__file__).resolve().parents[1]
START_DEADLINE_S = 240  # the driver's start on a loaded 2-core machine; past it the test fails
GONE_WITHIN_S = 30.0  # the watchdog's SIGTERM, grace and SIGKILL; Ray alone takes about 60 s
REFUSAL = "the checkpoint after step 2 could not be written to /run/checkpoints (no space)."
SLEEPER = "import sys, time; f = open(sys.argv[1], sys.argv[2]); time.sleep(600)"


def carries(process: psutil.Process, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or another user's
        return False


def alive(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):  # a zombie is gone: only its parent can reap it
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    return False


def left_after(processes: list[psutil.Process], marker: bytes, wait_s: float) -> list[str]:
    """Those of `processes`, or carrying `marker`, still alive after up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        marked = [p for p in psutil.process_iter() if carries(p, marker)]
        left = [p for p in {p.pid: p for p in processes + marked}.values() if alive(p)]
        if not left or time.monotonic() > deadline:
            return [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left if alive(p)]
        time.sleep(0.2)


def sleeper(path: Path, mode: str) -> subprocess.Popen:
    """A process holding `path` open with `mode` ("a": writing, "r": reading)."""
    process = subprocess.Popen([sys.executable, "-c", SLEEPER, str(path), mode])
    while not any(f.path == str(path) for f in psutil.Process(process.pid).open_files()):
        assert process.poll() is None
        time.sleep(0.02)
    return process


def test_the_watchdog_stops_exactly_the_processes_writing_into_its_session(tmp_path):
    session, elsewhere = tmp_path / "session_1" / "logs", tmp_path / "session_2"
    session.mkdir(parents=True)
    elsewhere.mkdir()
    for log in ("worker.out", "raylet.out"):
        (session / log).touch()
    writer = sleeper(session / "worker.out", "a")
    bystanders = [sleeper(session / "raylet.out", "r"), sleeper(elsewhere / "other.out", "a")]
    try:
        with open(session / "driver.log", "a"), watchdog(str(session.parent)):
            pass  # this test is the driver: it writes there too and must not be stopped
        assert writer.wait(timeout=GONE_WITHIN_S) == -signal.SIGTERM
        assert [b.poll() for b in bystanders] == [None, None]
    finally:
        for process in [writer, *bystanders]:
            process.kill()
            process.wait()


def test_the_loopback_switch_holds_for_the_next_ray_start_only(monkeypatch):
    from ray._private import ray_constants, worker  # noqa: PLC0415

    switch = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    monkeypatch.setenv(switch, "1")  # as a joined-cluster run sets it
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    for started in (True, False):
        restore = keep_ray_on_loopback()
        assert (os.environ[switch], ray_constants.ENABLE_RAY_CLUSTER) == ("0", False)
        if started:  # what `ray.init` does once Ray has started
            (hook,) = [h for h in worker._post_init_hooks if h is restore]
            hook()
        else:  # a start that failed: the caller puts it back
            restore()
        assert (os.environ[switch], ray_constants.ENABLE_RAY_CLUSTER) == ("1", True)
        assert restore not in worker._post_init_hooks
        restore()  # a second call changes nothing
        assert (os.environ[switch], ray_constants.ENABLE_RAY_CLUSTER) == ("1", True)


def layout() -> Layout:
    return Layout(
        kind=PlacementKind.da,
        hosts=2,
        devices_per_host=1,
        trainer_hosts=1,
        rollout_hosts=1,
        hosts_per_engine=1,
        staleness=1,
        cpu=True,
        transport=TransportKind.ray,
    )


@pytest.fixture(scope="module")
def local_session() -> SimpleNamespace:
    """One local Ray session on loopback, entered with Ray's multi-node switch on (as a joined
    cluster's run leaves it): what was seen in it, and after it."""
    import ray  # noqa: PLC0415
    from ray._private import ray_constants  # noqa: PLC0415

    def switch() -> tuple:
        return os.environ[
            ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
        ], ray_constants.ENABLE_RAY_CLUSTER

    @ray.remote(num_cpus=1)
    class RefusingTrainerHost:
        def train(self):
            raise ConfigError(REFUSAL)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "1")
        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
        before = switch()
        with ray_session(layout(), RaySpec(), CoordinatorSpec(bind_address="127.0.0.1")):
            during = switch()
            session_dir = os.path.realpath(ray._private.worker._global_node.get_session_dir_path())
            # an actor started after the switch was put back (the raylet keeps it for them)
            with pytest.raises(ConfigError) as refused:
                RayActors._from_trainers(
                    None, [RefusingTrainerHost.remote().train.remote()], during=""
                )
            names, listening = set(), {}
            for process in cluster_processes(session_dir, os.getpid()):
                try:  # a process of the cluster may end between the listing and the reading
                    name = process.name()
                    for c in process.net_connections(kind="inet"):
                        if c.status == psutil.CONN_LISTEN:
                            listening[(c.laddr.ip, c.laddr.port)] = name
                    names.add(name)
                except psutil.NoSuchProcess:
                    continue
            node = ray.nodes()[0]["NodeManagerAddress"]
        after = switch()
        return SimpleNamespace(
            switch=(before, during, after),
            names=names,
            listening=listening,
            node=node,
            refusal=refused.value,
            still_initialized=ray.is_initialized(),
            left=cluster_processes(session_dir, os.getpid()),
        )


@pytest.mark.slow
def test_a_local_cluster_on_loopback_leaves_rays_switch_as_it_was(local_session):
    """The switch holds for the cluster's processes (Ray listens on 127.0.0.1 only) and not for
    this process, during the session or after it; nothing of the cluster is left after it."""
    assert local_session.switch == (("1", True),) * 3
    assert {"gcs_server", "raylet"} <= local_session.names
    assert any(name.startswith("ray::RefusingTrainerHost") for name in local_session.names)
    assert_loopback_only(local_session.listening)
    assert local_session.node == "127.0.0.1"
    assert not local_session.still_initialized and not local_session.left


@pytest.mark.slow
def test_a_trainer_hosts_sentence_reaches_the_driver_as_it_is(local_session):
    """A trainer host's `ConfigError` (a checkpoint it could not write) ends the run with its one
    sentence, not with Ray's wrapper and the actor's traceback."""
    assert type(local_session.refusal) is ConfigError
    assert str(local_session.refusal) == REFUSAL


def test_a_trainer_host_reports_a_failed_background_save_before_its_next_step():
    class FailedSave:  # a RunCheckpoints whose background save failed
        def check(self):
            raise ConfigError(REFUSAL)

    host = TrainerHost(index=0, hosts=1)
    host.checkpoints = FailedSave()
    with pytest.raises(ConfigError, match="could not be written"):
        host.train(3, batches=[])  # before it fetches a batch or trains


def driver_tree(driver: subprocess.Popen) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(driver.pid).children(recursive=True)
    return []


@pytest.mark.slow
def test_no_ray_process_of_a_sigkilled_da_driver_is_left(tmp_path):
    """One `da` run (test_step_loop's 2-host layout), SIGKILLed once its rollout host exists:
    no training step is needed, Ray's agents and actors are up by then."""
    marker = f"LOCOEXP_TEST_OWNER=ray-session-{os.getpid()}"
    overrides = [o for o in overrides_of("da_2hosts") if not o.startswith("steps=")]
    driver = subprocess.Popen(
        [sys.executable, "run.py", *overrides, "steps=1000", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO,
        env={**os.environ, "LOCOEXP_TEST_OWNER": marker.split("=")[1]},
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "driver.err").open("w"),
    )
    reader, tree = None, []
    try:
        start = time.monotonic()
        while not any(p.name().startswith("ray::RolloutHost") for p in tree if alive(p)):
            assert driver.poll() is None, (tmp_path / "driver.err").read_text()[-3000:]
            assert time.monotonic() - start < START_DEADLINE_S, "no rollout host in time"
            time.sleep(0.2)
            tree = driver_tree(driver)
        names = {p.name() for p in tree if alive(p)}
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent", "raylet"} <= names, names
        # someone reading the cluster's log is not the cluster's: it must outlive the sweep
        (raylet,) = [p for p in tree if p.name() == "raylet"]
        log = next(f.path for f in raylet.open_files() if f.path.endswith("/raylet.out"))
        reader = sleeper(Path(log), "r")
        driver.kill()
        driver.wait()
        left = left_after(driver_tree(driver) + tree, marker.encode(), GONE_WITHIN_S)
        assert not left, f"left {GONE_WITHIN_S:.0f} s after the driver's SIGKILL: {left}"
        assert reader.poll() is None
    finally:
        driver.kill()
        for process in tree:
            with contextlib.suppress(psutil.Error):
                process.kill()
        if reader is not None:
            reader.kill()
            reader.wait()
