"""`placement=da` runs that survive (issue 13), with real Ray actors and processes on CPU (tiny
model, 2 hosts, split 0.5): a rollout host killed with SIGKILL is restarted and its lost batch
regenerated, so the run completes every step with the uninterrupted run's losses; a killed
trainer host (or one Ray's memory monitor killed) ends the run with one sentence and leaves no
Ray process; a driver stopped with SIGTERM checkpoints and the same command resumes it to the
uninterrupted run's losses, every socket of both runs listening on loopback only (README,
"Security"); a 3-host driver killed with SIGKILL at staleness 3 (staleness 1 is the SIGTERM
test's), a rollout host slowed each step, resumes to the uninterrupted run's batches exactly
and its losses within 1e-5 (issue 44; the uninterrupted run recorded in
`fixtures/da_resume_reference.json`).

Every test looks only at its own processes: Ray's daemons and actors inherit this test's
`LOCOEXP_TEST_OWNER` (and so do those of a `run.py` started here).

The uninterrupted run is test_step_loop's `da` run: the same overrides (plus checkpoints, which
change no value), whose per-step losses and rewards that module checks against
`fixtures/step_loop_reference.json`; these runs are held to the same values."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import da_resume_reference
import numpy as np
import psutil
import pytest
from cli_runs import (
    assert_loopback_only,
    assert_same_steps,
    kill,
    run_through,
    sockets_of,
    start,
    step_records,
)
from da_resume_reference import STALE_STEPS
from step_loop_reference import REFERENCE, golden_steps, overrides_of

from locoexp.compose import compose_config
from locoexp.errors import RunFailed
from locoexp.main import run as run_grpo
from locoexp.metrics.run_records import read_metrics_jsonl
from locoexp.placement.ray.saved_batches import batch_path
from locoexp.placement.ray.session import keep_ray_on_loopback
from locoexp.placement.ray.transport import RayActors

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
UNINTERRUPTED = REFERENCE["runs"]["da_2hosts"]
STEPS = len(UNINTERRUPTED["steps"]["train/loss"])
RUN = [  # test_step_loop's da run (placement=da split=0.5 hardware.hosts=2), with checkpoints
    *(o for o in overrides_of("da_2hosts") if not o.startswith("steps=")),
    "checkpoint_every_steps=2",
]
DEADLINE_S = 240  # one run on a loaded 2-core machine; a run past it fails the test at once
STOP_WITHIN_S = 30.0  # SIGTERM to exit of the driver, its actors and Ray

os.environ["LOCOEXP_TEST_OWNER"] = str(os.getpid())


def started_here(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return process.environ().get("LOCOEXP_TEST_OWNER") == str(os.getpid())
    return False


def own_processes(prefix: str | None = None) -> list[psutil.Process]:
    """This test's Ray processes (actors `ray::...` and the daemons), or those whose command
    line starts with `prefix`."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if prefix is None:
            hit = cmdline.startswith("ray::") or process.info["name"] in ("raylet", "gcs_server")
        else:
            hit = cmdline.startswith(prefix)
        if hit and started_here(process):
            found.append(process)
    return found


def ledger(run_dir: Path) -> list[dict]:
    path = run_dir / "batches.jsonl"  # JSON lines like metrics.jsonl (a cut last line skipped)
    return read_metrics_jsonl(path) if path.exists() else []


def trained_steps(run_dir: Path) -> list[int]:
    return [row["step"] for row in ledger(run_dir) if "example_ids" in row]


def wait_for_trained_step(run_dir: Path, *, alive) -> None:
    """Until the ledger holds a trained step (polled every 10 ms: the kill lands mid-run)."""
    start = time.monotonic()
    while not trained_steps(run_dir):
        assert alive(), "the run ended before its first step"
        assert time.monotonic() - start < DEADLINE_S, f"no step within {DEADLINE_S} s"
        time.sleep(0.01)


def assert_same_losses(run_dir: Path) -> None:
    assert_same_steps(step_records(run_dir), golden_steps("da_2hosts"), STEPS)


def test_a_killed_rollout_host_is_restarted_and_every_step_trained_once(tmp_path):
    killed: list[int] = []
    done = threading.Event()

    def kill_the_rollout_host():
        hosts = []
        while not hosts and not done.is_set():  # the actor exists before step 0 is trained
            hosts = own_processes("ray::RolloutHost")
            time.sleep(0.05)
        while not trained_steps(tmp_path) and not done.is_set():
            time.sleep(0.01)
        if hosts and not done.is_set():
            hosts[0].kill()
            killed.append(hosts[0].pid)

    killer = threading.Thread(target=kill_the_rollout_host, daemon=True)
    killer.start()
    try:
        summary = run_grpo(
            compose_config([*RUN, f"steps={STEPS}"]), run_dir=tmp_path, progress=False
        )
    finally:
        done.set()
        killer.join()
    assert killed, "the run ended before the kill"
    assert trained_steps(tmp_path) == list(range(STEPS))
    restarts = [row for row in ledger(tmp_path) if row.get("event") == "rollout_restart"]
    assert len(restarts) == 1 and restarts[0]["host"] == 0, restarts
    assert restarts[0]["regenerated"] == "batch" and restarts[0]["step"] >= 1
    assert summary["da/rollout_restarts"] == 1
    assert step_records(tmp_path)[-1]["da/rollout_restarts"] == 1
    # the regenerated batch is the lost one: same prompts, sampling key and weights
    assert_same_losses(tmp_path)
    assert not own_processes()


def _start(run_dir: Path, extra: list[str]) -> subprocess.Popen:
    command = [sys.executable, "run.py", *RUN, *extra, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(run: subprocess.Popen, timeout_s: float = DEADLINE_S) -> tuple[str, str]:
    try:
        return run.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        run.kill()
        run.communicate()
        pytest.fail(f"the run did not end within {timeout_s} s")


def _ray_processes_after(wait_s: float = 20.0) -> list[str]:
    """The command lines of this test's Ray processes still running after up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while (left := own_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [" ".join(p.cmdline()) for p in left if p.is_running()]


def _no_ray_process_left(wait_s: float = 20.0) -> None:
    left = _ray_processes_after(wait_s)
    assert not left, left


LOST = {
    # a trainer host is never restarted; a rollout host without restart budget is not either
    "trainer": ("ray::TrainerHost", [], "trainer host 0 of 1 (a ray::TrainerHost actor) died"),
    "rollout, no restarts left": (
        "ray::RolloutHost",
        ["placement.rollout_restarts=0"],
        "rollout host 0 of 1 (a ray::RolloutHost actor) died",
    ),
}


@pytest.mark.parametrize("lost", LOST)
def test_a_host_that_is_not_restarted_ends_the_run_with_one_sentence(tmp_path, lost):
    process, extra, sentence = LOST[lost]
    run = _start(tmp_path, ["steps=5000", *extra])
    wait_for_trained_step(tmp_path, alive=lambda: run.poll() is None)
    killed = own_processes(process)
    assert len(killed) == 1
    killed[0].kill()
    out, err = _finish(run, timeout_s=60)
    assert run.returncode == 1, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert sentence in errors[0], errors[0]
    assert "resume with: python run.py" in errors[0] and f"hydra.run.dir={tmp_path}" in errors[0]
    _no_ray_process_left()


@pytest.fixture(scope="module")
def stopped_then_resumed(tmp_path_factory) -> SimpleNamespace:
    """A run whose driver gets SIGTERM after its first trained step, then the same command with
    `resume=must`; what the tests check, read before the resume could change it, and every
    listening socket of both runs' process trees."""
    run_dir, extra = tmp_path_factory.mktemp("sigterm") / "run", [f"steps={STEPS}"]
    run = _start(run_dir, extra)
    with sockets_of(run) as stopped_sockets:
        wait_for_trained_step(run_dir, alive=lambda: run.poll() is None)
        sent = time.monotonic()
        run.send_signal(signal.SIGTERM)  # the driver only: it stops its actors and Ray
        _, err = _finish(run, timeout_s=60)
        stop_s = time.monotonic() - sent
    stopped_at = len(step_records(run_dir))
    stopped = SimpleNamespace(
        returncode=run.returncode,
        err=err,
        stop_s=stop_s,
        steps=stopped_at,
        next_batch_saved=batch_path(run_dir, stopped_at, stopped_at).is_file(),
        ray_left=_ray_processes_after(),
    )
    resumed = _start(run_dir, [*extra, "resume=must"])
    with sockets_of(resumed) as resumed_sockets:
        _, resumed_err = _finish(resumed)
    return SimpleNamespace(
        run_dir=run_dir,
        stopped=stopped,
        resumed=SimpleNamespace(returncode=resumed.returncode, err=resumed_err),
        sockets={**stopped_sockets, **resumed_sockets},
    )


def test_sigterm_of_the_driver_then_the_same_command_resumes_exactly(stopped_then_resumed):
    stopped, resumed = stopped_then_resumed.stopped, stopped_then_resumed.resumed
    run_dir = stopped_then_resumed.run_dir
    err = stopped.err
    assert stopped.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert len([line for line in err.splitlines() if "resume with:" in line]) == 1, err[-3000:]
    # issue 13 stops within ~5 s on an idle machine; the bound is what a loaded 2-core machine
    # keeps (the driver saves the next batch and stops its actors and Ray), and the run stopping
    # before its last step (below) is the property
    assert stopped.stop_s < STOP_WITHIN_S, f"the stop took {stopped.stop_s:.1f} s"
    assert 1 <= stopped.steps < STEPS, "the run finished before the stop"
    assert stopped.next_batch_saved  # the next batch, saved
    assert not stopped.ray_left, stopped.ray_left
    assert resumed.returncode == 0, resumed.err[-3000:]
    assert_same_losses(run_dir)
    assert trained_steps(run_dir) == list(range(STEPS))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["resume/attempts"] == 2


def test_a_da_run_listens_on_loopback_only(stopped_then_resumed):
    """README, "Security": the driver's, Ray's (gcs_server, raylet) and the actors' sockets."""
    names = set(stopped_then_resumed.sockets.values())
    assert {"gcs_server", "raylet"} <= names, names  # the watch saw Ray's own services
    assert_loopback_only(stopped_then_resumed.sockets)


def test_a_trainer_host_killed_by_rays_memory_monitor_is_named_in_one_sentence():
    # Ray raises OutOfMemoryError (not a RayActorError) for the call its memory monitor killed;
    # the used-by line on a 24 GiB machine ended that way with a traceback (experiments/LOG.md,
    # session 10). An actor raising the same error stands in for the kill.
    import ray  # noqa: PLC0415

    keep_ray_on_loopback()
    ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:

        @ray.remote
        class TrainerHost:
            def train(self):
                raise ray.exceptions.OutOfMemoryError("the node ran low on memory")

        call = TrainerHost.remote().train.remote()
        with pytest.raises(RunFailed) as failed:
            RayActors._from_trainers(None, [call], during="step 1")
    finally:
        ray.shutdown()
    message = str(failed.value)
    assert message.startswith("trainer host 0 of 1 (a ray::TrainerHost actor) was killed by ")
    assert "memory monitor during step 1" in message and "\n" not in message
    _no_ray_process_left()


# Exact resume at every staleness (issue 44): one trainer host and two rollout hosts, one of them
# slowed each step (`da_resume_reference.STALE_RUN`). The uninterrupted run is recorded
# (`fixtures/da_resume_reference.json`, `python tests/da_resume_reference.py`): runs of these
# overrides train the same batches to the same floats in any process, so the resumed run is held
# to the recorded one exactly, as it was to an uninterrupted run started beside it.


def latest_checkpoint(run_dir: Path) -> int | None:
    directory = run_dir / "checkpoints"
    saved = (
        [int(p.name) for p in directory.iterdir() if p.name.isdigit()] if directory.is_dir() else []
    )
    return max(saved, default=None)


# Staleness 3 only: it holds three batches in flight at the checkpoint, the case staleness 2
# is a smaller instance of; staleness 1 (the default) is the SIGTERM-and-resume test's. Its own
# xdist group, so it runs beside this module's other runs.
@pytest.mark.parametrize(
    "staleness", [pytest.param(3, marks=pytest.mark.xdist_group("da_resume_s3"))]
)
def test_kill_9_then_the_same_command_trains_the_uninterrupted_runs_batches(tmp_path, staleness):
    """The driver's process group killed with SIGKILL once the checkpoint after 2 updates is
    complete, then the same command: every step's batch (prompts and weight versions), loss,
    reward and staleness are the uninterrupted (recorded) run's, exactly. The batches in flight
    at the checkpoint were sampled with weights the checkpoint does not hold; only the saved
    batches give them back."""
    args, want = da_resume_reference.overrides(staleness), da_resume_reference.load()[staleness]
    resumed = tmp_path / "resumed"
    run = start(resumed, args)
    deadline = time.monotonic() + DEADLINE_S
    while latest_checkpoint(resumed) is None:
        assert run.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline, f"no checkpoint within {DEADLINE_S} s"
        time.sleep(0.01)
    kill(run)
    resumed_from = latest_checkpoint(resumed)
    assert resumed_from < STALE_STEPS, "the run finished before the kill"
    _no_ray_process_left()
    run_through(resumed, args)
    got = da_resume_reference.record(resumed)
    assert got["batches"] == want["batches"]
    assert [row[0] for row in got["steps"]] == list(range(STALE_STEPS))
    # loss and reward as the recorded run's within the step-loop golden's tolerance (the
    # recording may come from another CPU, whose XLA code rounds differently); staleness exactly
    got_steps, want_steps = np.array(got["steps"]), np.array(want["steps"])
    np.testing.assert_allclose(got_steps[:, 1:3], want_steps[:, 1:3], rtol=1e-5, atol=1e-5)
    assert [row[3] for row in got["steps"]] == [row[3] for row in want["steps"]]
    assert max(row[3] for row in want["steps"]) == staleness  # the bound was reached
    assert json.loads((resumed / "summary.json").read_text())["resume/attempts"] == 2
