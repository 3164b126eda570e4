"""The W&B logger, checked on the offline run's own .wandb file (no mock, no network)."""

import json
import struct
import time
from pathlib import Path

import pytest
from wandb.proto import wandb_internal_pb2

from locoexp.metrics import wandb_logger
from locoexp.metrics.config import LoggerConfig, LoggerKind, WandbMode
from locoexp.metrics.wandb_logger import (
    RUN_ID_FILE,
    NullLogger,
    WandbLogger,
    build_logger,
    has_wandb_credentials,
    resolve_mode,
)

RESOLVED = {
    "model": {"name": "tiny_qwen"},
    "placement": {"kind": "co"},
    "hardware": {"chips": 2},
    "steps": 3,
}
STEP_KEYS = ("timing/step_s", "timing/generation_s", "rollout/reward_mean", "train/loss")


def test_the_environment_variable_names_are_those_of_the_installed_wandb():
    """The module names W&B's variables itself (no wandb import at start-up); they must stay
    W&B's own."""
    import wandb

    assert wandb_logger.MODE_ENV == wandb.env.MODE
    assert wandb_logger.API_KEY_ENV == wandb.env.API_KEY
    assert wandb_logger.BASE_URL_ENV == wandb.env.BASE_URL
    assert wandb_logger.IDENTITY_TOKEN_FILE_ENV == wandb.env.IDENTITY_TOKEN_FILE


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch, tmp_path):
    for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "wandb-home"))


def read_wandb_records(path: Path):
    """Records of a .wandb file: W&B's 7-byte header, then a LevelDB log (32 KiB blocks of
    records with a 7-byte header: crc32c, length, type FULL=1 FIRST=2 MIDDLE=3 LAST=4)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunks = 32768, 7, []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        chunks.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def items(update) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in update}


def read_run(run_dir: Path, run_id: str):
    """(run record, history rows, final summary) of every offline run file with this id."""
    files = sorted(run_dir.glob(f"wandb/offline-run-*-{run_id}*/run-{run_id}.wandb"))
    runs, history, summary = [], [], {}
    for path in files:
        for record in read_wandb_records(path):
            match record.WhichOneof("record_type"):
                case "run":
                    runs.append(record.run)
                case "history":
                    history.append(items(record.history.item))
                case "summary":
                    summary.update(items(record.summary.update))
    return files, runs, history, summary


def start_in_a_new_second() -> None:
    """W&B names an offline segment by its start second and run id: two launches of one run in
    the same second would share a directory (a real restart takes seconds, a test does not)."""
    time.sleep(1.0 - time.time() % 1.0 + 0.05)


def log_steps(logger, steps):
    for step in steps:
        logger.log(
            {
                "timing/step_s": 1.0 + step,
                "timing/generation_s": 0.5,
                "rollout/reward_mean": step / 10,
                "train/loss": 0.1,
            },
            step=step,
        )


def make_config(**kwargs):
    return LoggerConfig(
        kind=LoggerKind.wandb, project="locoexp-test", job_type="train", tags=["pulse"], **kwargs
    )


def test_offline_run_holds_the_resolved_config_and_history_keys(tmp_path):
    run_dir = tmp_path / "run"
    logger = build_logger(
        make_config(),
        run_dir=run_dir,
        resolved_config=RESOLVED,
        run_name="pulse",
        sweep_name="2026-11-30_sweep",
    )
    assert isinstance(logger, WandbLogger)
    log_steps(logger, range(3))
    logger.log({"eval/accuracy": 0.75, "eval/seconds": 2.0, "eval/examples": 8}, step=2)
    logger.summary({"cost/chip_hours": 0.25, "cost/status": "reached"})
    logger.finish()

    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    files, runs, history, summary = read_run(run_dir, run_id)
    assert len(files) == 1 and len(runs) == 1
    run = runs[0]
    assert run.run_id == run_id and run.project == "locoexp-test"
    assert run.run_group == "2026-11-30_sweep" and run.job_type == "train"
    assert list(run.tags) == ["pulse"] and run.display_name == "pulse"
    config = items(run.config.update)
    assert {key: config[key] for key in RESOLVED} == RESOLVED
    steps = [row for row in history if "timing/step_s" in row]
    assert [row["step"] for row in steps] == [0, 1, 2]
    assert all(set(STEP_KEYS) <= set(row) for row in steps)
    evals = [row for row in history if "eval/accuracy" in row]
    assert [(row["step"], row["eval/accuracy"]) for row in evals] == [(2, 0.75)]
    assert summary["cost/chip_hours"] == 0.25 and summary["cost/status"] == "reached"


def test_a_restarted_run_resumes_the_same_wandb_run(tmp_path):
    run_dir = tmp_path / "run"
    first = build_logger(
        make_config(group="fixed"), run_dir=run_dir, resolved_config=RESOLVED, run_name="pulse"
    )
    log_steps(first, range(2))
    first.finish()
    start_in_a_new_second()
    second = build_logger(
        make_config(group="fixed"), run_dir=run_dir, resolved_config=RESOLVED, run_name="pulse"
    )
    log_steps(second, range(2, 4))
    second.finish()

    assert first.run_id == second.run_id
    files, runs, history, _ = read_run(run_dir, first.run_id)
    assert len(files) == 2  # one offline segment per launch; `wandb sync` joins them by id
    assert {run.run_id for run in runs} == {first.run_id}
    assert {run.run_group for run in runs} == {"fixed"}
    assert [row["step"] for row in history] == [0, 1, 2, 3]


def test_kind_none_logs_nothing_and_writes_nothing(tmp_path):
    logger = build_logger(
        LoggerConfig(kind=LoggerKind.none),
        run_dir=tmp_path / "run",
        resolved_config=RESOLVED,
        run_name="pulse",
    )
    assert isinstance(logger, NullLogger)
    log_steps(logger, range(2))
    logger.summary({"cost/chip_hours": 1.0})
    logger.finish()
    assert not (tmp_path / "run").exists()


def test_mode_is_offline_without_credentials_and_online_with_them(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE")
    assert not has_wandb_credentials()
    assert resolve_mode(None) == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert resolve_mode(None) == "online"
    assert resolve_mode(WandbMode.offline) == "offline"
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert resolve_mode(None) == "online"


def test_wandb_mode_from_the_environment_wins_over_credentials(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert resolve_mode(None) == "offline"  # WANDB_MODE=offline from the fixture stands
