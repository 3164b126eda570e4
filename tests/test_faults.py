"""Faults of the environment (issue 31): each ends in one sentence naming the path, port, key or
id and what to do, exit code 2 (130 for a second Ctrl-C), no traceback, and nothing written or
changed that was not there before (the watched tree hashed before and after).

Most cases are refused by `python run.py` at start-up (`locoexp.preflight`), before Hydra makes
the run directory or jax compiles anything: a few seconds each. The second Ctrl-C needs a real
run (the tiny model, stopped during its first step); a disk that fills during a run is shown on
`RunCheckpoints` itself with a few small arrays on a small tmpfs. Cases that need `mount` (a
read-only or a small file system) skip where the test is not root.
"""

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_preflight import hermetic_env, run_cli
from test_wandb_logger import RESOLVED, log_steps, make_config, read_run

from locoexp.checkpoint.export import export_policy
from locoexp.checkpoint.progress import RunProgress, config_digest
from locoexp.checkpoint.state import RunCheckpoints, latest_saved_step, saved_progress
from locoexp.compose import compose_config
from locoexp.errors import ConfigError
from locoexp.metrics.record import MetricsFile
from locoexp.metrics.wandb_logger import RUN_ID_FILE, build_logger
from locoexp.model.checkpoint import check_checkpoint, save_checkpoint
from locoexp.model.config import ModelConfig
from locoexp.model.transformer import build_model
from locoexp.session.build import config_as_dict
from locoexp.tokenizer.digits import DigitTokenizer

ROOT = Path(__file__).resolve().parents[1]
TINY = ["steps=2", "logger=none"]


def tree(root: Path) -> dict[str, tuple[int, str]]:
    """Every path under `root`: its mode and (for a file) the sha256 of its bytes."""
    if not root.exists():
        return {}
    found = {}
    for path in [root, *root.rglob("*")]:
        data = path.read_bytes() if path.is_file() else b""
        found[str(path)] = (path.stat().st_mode, hashlib.sha256(data).hexdigest())
    return found


def one_sentence(result: subprocess.CompletedProcess, code: int, *named: str) -> str:
    """Exit `code`, no traceback, exactly one `error:` line, naming everything in `named`."""
    output = result.stderr + result.stdout
    assert result.returncode == code, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output[-3000:]
    for text in named:
        assert text in errors[0], errors[0]
    return errors[0]


@contextlib.contextmanager
def mounted(where: Path, options: str):
    """A tmpfs mounted at `where` for the test (skips where mounting is not allowed)."""
    where.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (not root?): {made.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


# ---- the battery: refused at start-up ------------------------------------------------------------


def _read_only(tmp_path, stack):
    ro = stack.enter_context(mounted(tmp_path / "ro", "ro,size=1m"))
    return ro / "run", [], ro, ["hydra.run.dir=", str(ro), "Read-only file system"]


def _under_proc(tmp_path, stack):
    return "/proc/locoexp-faults", [], tmp_path, ["/proc/locoexp-faults", "cannot be written"]


def _a_regular_file(tmp_path, stack):
    file = tmp_path / "file"
    file.write_text("not a directory\n")
    return file, [], tmp_path, [f"hydra.run.dir={file}", "is an existing file"]


def _a_small_disk(tmp_path, stack):
    small = stack.enter_context(mounted(tmp_path / "small", "size=1m"))
    return small / "run", [], small, ["MiB free", "checkpoints of", "larger disk"]


def _a_port_in_use(tmp_path, stack):
    listener = stack.enter_context(socket.socket())
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    args = ["hardware.hosts=2", f"hardware.coordinator_port={port}"]
    return tmp_path / "run", args, tmp_path, [f"hardware.coordinator_port={port}", "in use"]


def _a_foreign_bind_address(tmp_path, stack):
    address = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never an address of this machine
    args = ["hardware.hosts=2", f"hardware.bind_address={address}"]
    return tmp_path / "run", args, tmp_path, [f"hardware.bind_address={address}", "not an address"]


def _a_contradicted_preset(tmp_path, stack):
    args = ["hardware=tpu_v7x_8", "hardware.chip=cpu"]
    return (
        tmp_path / "run",
        args,
        tmp_path,
        ["hardware.chip=cpu", "hardware=tpu_v7x_8", "hardware=cpu"],
    )


def _a_finished_run(run_dir: Path, args: list[str]) -> None:
    """A run directory as a finished run leaves it, as far as start-up reads it: its recorded
    config and its checkpoint's progress (`checkpoint.state.saved_progress`'s file)."""
    digest = config_digest(config_as_dict(compose_config(args)))
    progress = RunProgress(next_step=2, seed=0, elapsed_s=1.0, eval_total_s=0.0)
    (run_dir / "checkpoints" / "2" / "progress").mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text("algo:\n  learning_rate: 1.0e-06\n")
    (run_dir / "run.log").write_text("the finished run's log\n")
    metadata = progress.to_json() | {"config_digest": digest}
    (run_dir / "checkpoints" / "2" / "progress" / "metadata").write_text(json.dumps(metadata))


def _a_rerun_with_another_learning_rate(tmp_path, stack):
    run_dir = tmp_path / "run"
    _a_finished_run(run_dir, TINY)
    named = ["checkpoints", "algo.learning_rate", "a new hydra.run.dir"]
    return run_dir, ["algo.learning_rate=1e-5"], run_dir, named


def _resume_must_on_a_fresh_directory(tmp_path, stack):
    return tmp_path / "run", ["resume=must"], tmp_path, ["resume=must", "holds no checkpoint"]


def _an_uncached_hub_id(tmp_path, stack):
    args = ["model.checkpoint=locoexp-test/absent"]
    return tmp_path / "run", args, tmp_path, ["locoexp-test/absent", "hf download"]


CASES = {
    "read-only file system": _read_only,
    "a path under /proc": _under_proc,
    "a regular file as hydra.run.dir": _a_regular_file,
    "a disk too small for the checkpoints": _a_small_disk,
    "coordinator port in use": _a_port_in_use,
    "bind address not this machine's": _a_foreign_bind_address,
    "a preset contradicted by a key": _a_contradicted_preset,
    "a rerun with another learning rate": _a_rerun_with_another_learning_rate,
    "resume=must on a fresh directory": _resume_must_on_a_fresh_directory,
    "an uncached Hub id": _an_uncached_hub_id,
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_fault_is_one_sentence_exit_2_and_changes_nothing(tmp_path, case):
    with contextlib.ExitStack() as stack:
        run_dir, args, watched, named = case(tmp_path, stack)
        (tmp_path / "cwd").mkdir()
        before = tree(watched)
        env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
        result = run_cli(tmp_path, *TINY, *args, run_dir=str(run_dir), **env)
        one_sentence(result, 2, *named)
        assert tree(watched) == before
        assert list((tmp_path / "cwd").iterdir()) == []  # no outputs/ or wandb/ either


# ---- the cases around the battery -------------------------------------------------------------


def test_a_cached_hub_id_passes_the_start_up_checks(tmp_path, monkeypatch):
    """README: `model.checkpoint=<Hub id>` of a snapshot in the local cache (the layout
    huggingface_hub keeps: models--owner--name/{refs/main, snapshots/<rev>/})."""
    snapshot = tmp_path / "hub" / "models--locoexp-test--tiny" / "snapshots" / "0123abcd"
    save_checkpoint(build_model(ModelConfig(), seed=0), ModelConfig(), str(snapshot))
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_checkpoint(ModelConfig(checkpoint="locoexp-test/tiny"))  # refused before: no directory


def test_a_full_disk_refuses_the_checkpoint_keeps_the_last_and_says_how_much(tmp_path):
    small = tmp_path / "small"
    with mounted(small, "size=1200k"):
        checkpoints = RunCheckpoints(small)
        state = {"w": jnp.ones((64, 2048), jnp.float32)}  # 0.5 MiB a checkpoint
        first = RunProgress(next_step=1, seed=0, elapsed_s=1.0, eval_total_s=0.0)
        checkpoints.save(first, state, wait=True)
        before = tree(small / "checkpoints" / "1")
        (small / "filler").write_bytes(b"\0" * (shutil.disk_usage(small).free - 100 * 1024))
        second = RunProgress(next_step=2, seed=0, elapsed_s=2.0, eval_total_s=0.0)
        with pytest.raises(ConfigError) as refused:
            checkpoints.save(second, state)
        checkpoints.close()
        message = str(refused.value)
        assert "step 2" in message and "needs 0.5 MiB" in message and "step 1 is intact" in message
        assert latest_saved_step(small) == 1 and tree(small / "checkpoints" / "1") == before
        assert saved_progress(small, 1) == first  # start-up reads the file orbax wrote
        assert sorted(p.name for p in (small / "checkpoints").iterdir()) == ["1"]  # no partial


def test_a_save_that_fails_in_the_background_is_named_by_the_next_save(tmp_path):
    """The disk fills while save 2 is written (its free-space check passed by 8 KiB): the next
    save, called at once as a fast step loop calls it, names step 2 in one sentence and leaves
    no partial of it (orbax's own wait for save 2, inside save 3, raised the OSError raw)."""
    small = tmp_path / "small"
    with mounted(small, "size=1200k"):
        checkpoints = RunCheckpoints(small)
        state = {"w": jax.random.normal(jax.random.key(0), (64, 2048))}  # 0.5 MiB, incompressible
        checkpoints.save(RunProgress(next_step=1, seed=0, elapsed_s=1.0, eval_total_s=0.0), state)
        checkpoints.wait()
        before = tree(small / "checkpoints" / "1")
        (small / "filler").write_bytes(b"\0" * (shutil.disk_usage(small).free - 2**19 - 2**13))
        second = RunProgress(next_step=2, seed=0, elapsed_s=2.0, eval_total_s=0.0)
        checkpoints.save(second, state)  # passes its free-space check; its files do not fit
        third = RunProgress(next_step=3, seed=0, elapsed_s=3.0, eval_total_s=0.0)
        with pytest.raises(ConfigError) as refused:
            checkpoints.save(third, state)
        checkpoints.close()
        message = str(refused.value)
        assert message.startswith("the checkpoint after step 2 could not be written"), message
        assert "No space left on device" in message and "step 1 is intact" in message
        assert tree(small / "checkpoints" / "1") == before
        assert sorted(p.name for p in (small / "checkpoints").iterdir()) == ["1"]  # no partial


def test_the_exported_weights_are_readable_by_others(tmp_path):
    model = build_model(ModelConfig(), seed=0)
    graphdef, params = nnx.split(model)
    directory = export_policy(params, graphdef, ModelConfig(), DigitTokenizer(), tmp_path / "p")
    umask = os.umask(0o022)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in directory.iterdir()}
    assert modes["model.safetensors"] == 0o666 & ~umask == modes["config.json"], modes


def test_a_finished_wandb_run_has_every_record_in_its_file_at_once(tmp_path, monkeypatch):
    """`WandbLogger.finish` returns only once the offline file holds the run: before, the file
    was closed by the wandb-core service after `finish` returned, and a resumed run's history
    read at once (tests/test_resume_records.py under load) could lack its steps."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "wandb-home"))
    run_dir = tmp_path / "run"
    logger = build_logger(make_config(), run_dir=run_dir, resolved_config=RESOLVED, run_name="r")
    log_steps(logger, range(8))
    logger.finish()
    _, _, history, _ = read_run(run_dir, (run_dir / RUN_ID_FILE).read_text().strip())
    assert [row["step"] for row in history if "timing/step_s" in row] == list(range(8))


# ---- a second Ctrl-C: a real run, stopped during its first step -------------------------------


@pytest.mark.slow
def test_a_second_ctrl_c_leaves_at_once_with_130_and_one_sentence(tmp_path):
    run_dir = tmp_path / "run"
    with open(tmp_path / "stderr", "wb") as err:
        run = subprocess.Popen(
            [sys.executable, "run.py", "steps=50", "logger=none", "hardware.hosts=2"]
            + [f"hydra.run.dir={run_dir}"],
            cwd=ROOT,
            env=hermetic_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,  # Ctrl-C reaches the whole group, as from a terminal
        )
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "admission").exists():  # the hosts are in their first step
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        checkpoints = tree(run_dir / "checkpoints")
        os.killpg(run.pid, signal.SIGINT)
        time.sleep(3.0)  # past stop.REPEAT_GRACE_S: a second request, not the first one echoed
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
    stderr = (tmp_path / "stderr").read_text(errors="replace")
    assert run.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert "Traceback" not in stderr and "SystemExit" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if "SIGINT" in line]
    assert len(lines) == 1 and f"hydra.run.dir={run_dir}" in lines[0], stderr[-3000:]
    assert tree(run_dir / "checkpoints") == checkpoints  # nothing half-written, nothing lost
    assert np.all([not p.name.endswith("tmp") for p in (run_dir / "checkpoints").iterdir()])


def test_a_metrics_line_that_cannot_be_written_is_one_sentence_and_closes_quietly(tmp_path):
    # a disk with no room left: the file's buffered line cannot be flushed (/dev/full fails
    # every write with ENOSPC); closing the run's outputs afterwards must not raise over it
    path = tmp_path / "metrics.jsonl"
    path.symlink_to("/dev/full")
    metrics = MetricsFile(path)
    with pytest.raises(ConfigError) as refused:
        metrics.write({"step": 0, "train/loss": 1.0})
    message = str(refused.value)
    assert message.startswith(f"{path} could not be written (No space left on device); ")
    assert "rerun the same command to resume" in message and "\n" not in message
    metrics.close()
