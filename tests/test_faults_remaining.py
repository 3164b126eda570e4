"""The remaining faults of issue 44, each one sentence with a non-zero exit and no traceback, and
nothing already recorded lost:

- a full disk at every file a run writes besides the checkpoints and metrics.jsonl (those are in
  tests/test_faults.py): the admission records, the da batch ledger, a policy export, W&B's
  directory. A disk that is full at one file is a symlink to /dev/full (every write fails with
  ENOSPC) or a small tmpfs filled up (skipped where mounting is not allowed);
- a host that cannot reach its coordinator, bounded by `hardware.coordinator_timeout_s`;
- unparsable or unknown `hydra.*` overrides;
- a resume command Hydra parses for any directory name, run as printed;
- settings that do less than they seem (refused or warned at start-up);
- advice that names only settings which are accepted.

Most cases are in-process or refused at start-up; two run the tiny model for a step or two.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flax import nnx
from hydra import compose, initialize_config_dir
from test_faults import mounted, one_sentence, tree
from test_preflight import hermetic_env, run_cli

from locoexp.checkpoint.export import export_policy
from locoexp.checkpoint.progress import RunProgress
from locoexp.compose import CONFIG_DIR, EXPERIMENTS, compose_config, override_value
from locoexp.dataset.config import DatasetConfig
from locoexp.dataset.files import check_held_out_apart
from locoexp.dataset.schedule import build_schedule
from locoexp.errors import ConfigError
from locoexp.metrics.wandb_logger import check_room
from locoexp.model.config import ModelConfig
from locoexp.model.transformer import build_model
from locoexp.placement.admission import AdmissionLog, AdmissionRecord
from locoexp.placement.ray.ledger import BatchLedger
from locoexp.preflight import check_run, start_up_warnings
from locoexp.session.build import build_spec
from locoexp.tokenizer.digits import DigitTokenizer

ROOT = Path(__file__).resolve().parents[1]
TINY = ["steps=2", "logger=none"]
FULL = "(No space left on device)"


def full_at(path: Path) -> Path:
    """`path` as a file on a disk with no room left: every write to it fails with ENOSPC."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to("/dev/full")
    return path


def one_line(error: pytest.ExceptionInfo, *named: str) -> str:
    message = str(error.value)
    assert "\n" not in message and message.endswith("."), message
    for text in named:
        assert text in message, message
    return message


# ---- a full disk at each file ----------------------------------------------------------------


def test_a_full_disk_at_the_admission_records_is_one_sentence_naming_the_file(tmp_path):
    path = full_at(tmp_path / "admission" / "host0.jsonl")
    record = AdmissionRecord(
        requests=1, pretokenized=True, pid=1, seconds=0.0, cpu_seconds=0.0,
        first_submitted_ns=0, last_submitted_ns=0,
    )  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        AdmissionLog(path).write(0, record)
    one_line(refused, str(path), FULL, "earlier records", "rerun the same command")


def test_a_full_disk_at_the_ledger_is_one_sentence_and_closing_stays_quiet(tmp_path):
    # before: the row's OSError, then close() raised it again over the first (two tracebacks)
    path = full_at(tmp_path / "batches.jsonl")
    schedule = build_schedule(DatasetConfig(prompts_per_step=2), steps=2, num_examples=8)
    ledger = BatchLedger(schedule, list(range(8)), path)
    with pytest.raises(ConfigError) as refused:
        ledger.record_restart(host=1, step=0, regenerated="batch", weight_version=0)
    one_line(refused, str(path), FULL, "every checkpoint holds the rows")
    ledger.close()  # the pending row is not raised again


def test_a_full_disk_at_an_export_leaves_no_partial_and_names_the_directory(tmp_path):
    small = tmp_path / "small"
    with mounted(small, "size=64k"):
        model = build_model(ModelConfig(), seed=0)
        graphdef, params = nnx.split(model)
        directory = small / "policy" / "final"
        with pytest.raises(ConfigError) as refused:
            export_policy(params, graphdef, ModelConfig(), DigitTokenizer(), directory)
        one_line(refused, str(directory), "No space left on device", "no partial export")
        assert list((small / "policy").iterdir()) == []


def test_a_wandb_directory_without_room_is_refused_before_wandb_starts(tmp_path):
    small = tmp_path / "small"
    with mounted(small, "size=64k"):
        with pytest.raises(ConfigError) as refused:
            check_room(small / "wandb")
        one_line(refused, str(small / "wandb"), FULL, "logger=none")
        assert list((small / "wandb").iterdir()) == []  # the probe is gone


def test_a_co_run_whose_first_admission_write_finds_a_full_disk_ends_in_one_sentence(tmp_path):
    run_dir = tmp_path / "run"
    path = full_at(run_dir / "admission" / "host0.jsonl")
    result = run_cli(tmp_path, *TINY, run_dir=str(run_dir))
    one_sentence(result, 2, str(path), FULL)


# ---- the coordinator -------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens once it closes


@pytest.mark.parametrize("process_id", [1, 0], ids=["nothing listens", "the others never join"])
def test_a_host_that_cannot_join_its_coordinator_says_so_naming_the_key(tmp_path, process_id):
    address = f"127.0.0.1:{closed_port()}"
    args = [
        "hardware.hosts=2",
        f"hardware.coordinator_address={address}",
        f"hardware.process_id={process_id}",
        "hardware.bind_address=127.0.0.1",
        "hardware.coordinator_timeout_s=2",
    ]
    result = run_cli(tmp_path, *TINY, *args)
    one_sentence(result, 2, f"hardware.coordinator_address={address}", "within 2 s")
    assert "Check failure" not in result.stderr, result.stderr[-3000:]


def test_the_coordinator_timeout_must_be_positive():
    with pytest.raises(ConfigError, match="hardware.coordinator_timeout_s=0"):
        compose_config(["hardware.coordinator_timeout_s=0"])


# ---- hydra.* overrides ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("hydra.run.dir=a]b", "does not parse"),
        ("hydra.job.chdir=[", "does not parse"),
        ("hydra.foo=1", "valid keys of hydra are"),
        ("hydra.job.chdir=maybe", "hydra.job.chdir"),
    ],
)
def test_a_bad_hydra_override_is_one_sentence(tmp_path, override, named):
    result = run_cli(tmp_path, *TINY, override)
    message = one_sentence(result, 2, named)
    assert override.split("=")[0] in message
    assert not (tmp_path / "run").exists()


# ---- the resume command --------------------------------------------------------------------

ODD_NAMES = ["a;b", "a b", "it's", 'say "hi"', "k=v", "a,b", "x${y}", "back\\slash", "[a]"]


def test_every_directory_name_round_trips_through_hydras_parser(tmp_path):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for name in ODD_NAMES:
            wanted = str(tmp_path / name)
            override = f"hydra.run.dir={override_value(wanted)}"
            cfg = compose(
                config_name="config", overrides=[override, EXPERIMENTS], return_hydra_config=True
            )
            assert cfg.hydra.run.dir == wanted, override


@pytest.mark.slow
def test_the_printed_resume_command_resumes_a_run_in_an_oddly_named_directory(tmp_path):
    run_dir = tmp_path / 'run;1 it\'s "q" k=v,w'
    args = ["steps=3", "logger=none", "checkpoint_every_steps=1"]
    command = [sys.executable, "run.py", *args, f"hydra.run.dir={override_value(str(run_dir))}"]
    with open(tmp_path / "stderr", "wb") as err:
        run = subprocess.Popen(command, cwd=ROOT, env=hermetic_env(), stderr=err)
    try:
        while not (run_dir / "checkpoints" / "1").is_dir():  # a checkpoint to resume from
            assert run.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            time.sleep(0.2)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            run.kill()
    stderr = (tmp_path / "stderr").read_text()
    lines = [line for line in stderr.splitlines() if "SIGTERM" in line]
    assert len(lines) == 1, stderr[-3000:]
    printed = re.split(r"(?:resume|start again) with: ", lines[0])[1]
    env = hermetic_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    resumed = subprocess.run(
        ["bash", "-c", printed.replace("python", shutil.which("python") or sys.executable, 1)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in steps if "eval/accuracy" not in r) == [0, 1, 2]
    assert json.loads((run_dir / "summary.json").read_text())["resume/attempts"] == 2


# ---- settings that do less than they seem ---------------------------------------------------


def test_a_staleness_bound_past_the_runs_length_is_refused():
    with pytest.raises(ConfigError) as refused:
        compose_config(["placement=da", "split=0.5", "placement.max_staleness=3", "steps=3"])
    one_line(refused, "placement.max_staleness=3", "steps=3")
    compose_config(["placement=da", "split=0.5", "placement.max_staleness=2", "steps=3"])
    compose_config(["placement=da", "split=0.5", "steps=1"])  # the paper's 1 always applies


def test_a_straggler_host_slowed_by_nothing_is_warned_about():
    (notice,) = start_up_warnings(compose_config(["rollout.straggler.host=0"]))
    assert notice.startswith("rollout.straggler.host=0 is not read by this run (no straggler)")
    assert start_up_warnings(compose_config(["rollout.straggler.delay_s=0"])) == []
    slowed = ["rollout.straggler.host=0", "rollout.straggler.delay_s=1"]
    assert start_up_warnings(compose_config(slowed)) == []


def test_a_training_glob_that_includes_the_evaluation_file_is_refused(tmp_path):
    for name in ("train.jsonl", "test.jsonl"):
        (tmp_path / name).write_text('{"question": "1 + 1?", "answer": "#### 2"}\n')
    with pytest.raises(ConfigError) as refused:
        check_held_out_apart(f"{tmp_path}/*.jsonl", str(tmp_path / "test.jsonl"))
    one_line(refused, "dataset.data_files=", str(tmp_path / "test.jsonl"))
    check_held_out_apart(str(tmp_path / "train.jsonl"), str(tmp_path / "test.jsonl"))


# ---- advice names only settings that are accepted -------------------------------------------

SETTING = re.compile(r"(?<![\w.])([a-z_]+(?:\.[a-z_]+)*=[\w.\-]+)")


def suggested_settings(message: str, given: list[str]) -> list[str]:
    """The `key=value` settings a refusal names, less the ones the command gave."""
    return [s for s in SETTING.findall(message.rstrip(".")) if s not in given]


def _a_finished_run(run_dir: Path, args: list[str]) -> None:
    """A run directory as a finished run of `args` leaves it, as far as start-up reads it."""
    digest = build_spec(compose_config(args)).survival.config_digest
    progress = RunProgress(next_step=2, seed=0, elapsed_s=1.0, eval_total_s=0.0)
    (run_dir / "checkpoints" / "2" / "progress").mkdir(parents=True)
    metadata = progress.to_json() | {"config_digest": digest}
    (run_dir / "checkpoints" / "2" / "progress" / "metadata").write_text(json.dumps(metadata))


def _rerun_with_another_learning_rate(tmp_path):
    run_dir = tmp_path / "run"
    _a_finished_run(run_dir, TINY)
    return run_dir, ["algo.learning_rate=1e-5"]


def _resume_never_on_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    _a_finished_run(run_dir, TINY)
    return run_dir, ["resume=never"]


def _resume_must_on_a_fresh_directory(tmp_path):
    return tmp_path / "run", ["resume=must"]


ADVICE = {
    "a rerun with another learning rate": _rerun_with_another_learning_rate,
    "resume=never on a checkpoint": _resume_never_on_a_checkpoint,
    "resume=must on a fresh directory": _resume_must_on_a_fresh_directory,
}


@pytest.mark.parametrize("case", ADVICE.values(), ids=ADVICE.keys())
def test_a_refusals_advice_names_only_settings_that_are_accepted(tmp_path, case):
    run_dir, args = case(tmp_path)
    before = tree(run_dir)
    with pytest.raises(ConfigError) as refused:
        check_run(compose_config([*TINY, *args]), run_dir=run_dir)
    for setting in suggested_settings(str(refused.value), [*TINY, *args]):
        key = setting.split("=")[0]
        fixed = [a for a in [*TINY, *args] if a.split("=")[0] != key] + [setting]
        check_run(compose_config(fixed), run_dir=run_dir)  # raises if the advice is refused
    assert tree(run_dir) == before


def test_the_suggestion_parser_finds_the_settings_a_sentence_names():
    message = "use a new hydra.run.dir or resume=never; set opt.freeze_gc=false (e.g. model=tiny)."
    assert suggested_settings(message, []) == ["resume=never", "opt.freeze_gc=false", "model=tiny"]
