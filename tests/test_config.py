"""Every option of `conf/` composes and converts to the typed `Config`; bad input fails at start-up
with one sentence naming the key, exit code 2, no traceback and no run directory."""

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from locoexp.compose import compose_command_line, compose_config
from locoexp.config import Config
from locoexp.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# Specialisations (conf/config.yaml's `optional adapter_model: ${adapter}_${model}`) are chosen
# by the pair, not on their own: `test_every_specialisation_applies_to_its_pair`.
SPECIALISATIONS = sorted(p.stem for p in (CONF / "adapter_model").glob("*.yaml"))
OPTIONS = sorted(
    (group.name, option.stem)
    for group in CONF.iterdir()
    if group.is_dir() and group.name != "adapter_model"
    for option in group.glob("*.yaml")
)
# Options that are only valid together with another choice (cross-group checks of Config).
COMPANIONS = {
    ("placement", "da"): ["hardware=tpu_v7x_16", "split=0.5"],  # da needs >= 2 hosts and a split
    # 64 hosts need prompts_per_step % 64 == 0
    **{("hardware", f"tpu_{chip}_256"): ["dataset=gsm8k"] for chip in ("v5e", "v5p", "v6e", "v7x")},
    # its own values, on a model the tiny models' specialisation (conf/adapter_model/) leaves be
    ("adapter", "lora"): ["model=tiny_qwen"],
}


def test_every_group_has_options():
    groups = {group for group, _ in OPTIONS}
    assert {
        "model",
        "dataset",
        "hardware",
        "placement",
        "opt",
        "algo",
        "rollout",
        "logger",
        "adapter",
    } <= groups


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_converts_to_the_typed_config(group, option):
    config = compose_config([f"{group}={option}", *COMPANIONS.get((group, option), [])])
    assert isinstance(config, Config)
    section = getattr(config, group)
    assert type(section).__module__.startswith("locoexp.")  # a typed dataclass, not a dict
    # the option's YAML values reach the typed config (enums compared by value); a file of the
    # global package (placement=da also sets an opt key) holds its group's values under its name
    path = CONF / group / f"{option}.yaml"
    values = OmegaConf.to_container(OmegaConf.load(path))
    if path.read_text().startswith("# @package _global_"):
        values = values[group]
    for key, value in values.items():
        got = getattr(section, key)
        got = [getattr(g, "value", g) for g in got] if isinstance(got, list) else got
        got = getattr(got, "value", got)
        if isinstance(value, dict) or value is None:  # nested groups; null = derived at start-up
            continue
        assert got == value or (isinstance(value, int | float) and got == pytest.approx(value)), key


@pytest.mark.parametrize("pair", SPECIALISATIONS)
def test_every_specialisation_applies_to_its_pair(pair):
    adapter, model = pair.split("_", 1)
    assert (CONF / "adapter" / f"{adapter}.yaml").is_file()
    assert (CONF / "model" / f"{model}.yaml").is_file()
    config = compose_config([f"adapter={adapter}", f"model={model}"])
    for key, value in OmegaConf.to_container(
        OmegaConf.load(CONF / "adapter_model" / f"{pair}.yaml")
    ).items():
        got = getattr(config.adapter, key)
        got = [getattr(g, "value", g) for g in got] if isinstance(got, list) else got
        assert got == value, key
    # a key given on the command line still wins
    assert (
        compose_config([f"adapter={adapter}", f"model={model}", "adapter.rank=3"]).adapter.rank == 3
    )


# Every experiment file, cell by cell of its sweep: tests/test_experiments.py.


def test_default_config_has_a_root_split_key():
    assert compose_config([]).split is None


def run_cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "run.py",
            *overrides,
            f"hydra.run.dir={tmp_path}/x",
            f"hydra.sweep.dir={tmp_path}/m",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


BAD_OVERRIDES = {
    "wrong type": (["model.num_layers=abc"], "model.num_layers"),
    "unknown key": (["nonexistent_key=1"], "nonexistent_key"),
    "out of range": (["algo.learning_rate=-1"], "algo.learning_rate"),
    "split without da": (["placement=co", "split=0.25"], "split"),
    "missing option": (["model=nonexistent"], "model/nonexistent"),
    "bad enum value": (["algo.advantage=bogus"], "algo.advantage"),
    "cross-group": (["hardware.hosts=3"], "dataset.prompts_per_step"),
    "adapter rank": (["adapter=lora", "adapter.rank=0"], "adapter.rank"),
    "adapter target": (["adapter=lora", "adapter.targets=[q_proj,wq]"], "adapter.targets"),
    "adapter target the model lacks": (
        ["adapter=lora", "model=tiny_qwen3_moe", "adapter.targets=[gate_proj]"],
        "adapter.targets",
    ),
    "bad job of a sweep": (["-m", "seed=0,1", "algo.learning_rate=1e-3,-1"], "algo.learning_rate"),
}


@pytest.mark.parametrize("overrides, key", BAD_OVERRIDES.values(), ids=BAD_OVERRIDES.keys())
def test_bad_override_fails_with_one_sentence_naming_the_key(tmp_path, overrides, key):
    result = run_cli(tmp_path, *overrides)
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert message.startswith("error: ")
    assert key in message
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "x").exists() and not (tmp_path / "m").exists()


def test_messages_name_what_is_valid(tmp_path):
    assert "expected one of [grpo, dr_grpo]" in run_cli(tmp_path, "algo.advantage=bogus").stderr
    assert "tiny_qwen" in run_cli(tmp_path, "model=nonexistent").stderr
    assert "Integer" in run_cli(tmp_path, "model.num_layers=abc").stderr


def test_a_coordinator_port_the_cluster_would_ignore_is_refused():
    with pytest.raises(ConfigError, match="hardware.coordinator_port=1234"):
        compose_config(["hardware=tpu_v7x_16", "hardware.coordinator_port=1234"])
    # one local process starts no coordinator: the port would be dropped
    with pytest.raises(ConfigError, match=r"coordinator_port=1234 is not read by this run \("):
        compose_config(["hardware.coordinator_port=1234"])
    local = compose_config(["hardware.hosts=2", "hardware.coordinator_port=1234"])
    assert local.hardware.coordinator_port == 1234


def test_a_cluster_started_co_host_names_its_coordinator_and_index_or_is_refused():
    host = ["hardware.hosts=2", "hardware.coordinator_address=10.0.0.1:8476"]
    config = compose_config([*host, "hardware.process_id=1"])
    assert config.hardware.cluster_launched and config.hardware.process_id == 1
    assert config.hardware.listen_address(multi_machine=False) is None  # it spans machines
    refused = {
        "go together": host,
        "must be in \\[0, hardware.hosts\\)": [*host, "hardware.process_id=2"],
        "must be host 0's address and port": [
            "hardware.hosts=2",
            "hardware.coordinator_address=10.0.0.1",
            "hardware.process_id=0",
        ],
        "applies only to placement=co": [
            *host,
            "hardware.process_id=0",
            "placement=da",
            "split=0.5",
        ],
        "coordinator_port=9 is not read by this run": [
            *host,
            "hardware.process_id=0",
            "hardware.coordinator_port=9",
        ],
    }
    for message, overrides in refused.items():
        with pytest.raises(ConfigError, match=message):
            compose_config(overrides)


def test_appended_unknown_key_is_refused_before_the_run():
    with pytest.raises(Exception, match="nonexistent_key"):
        compose_command_line(["+nonexistent_key=1"])


def test_profile_steps_outside_the_run_are_refused():
    assert compose_config(["steps=3", "profile_steps=[0,2]"]).profile_steps == [0, 2]
    with pytest.raises(ConfigError, match=r"profile_steps=\[3\] must lie in \[0, steps=3\)"):
        compose_config(["steps=3", "profile_steps=[3]"])
    da = ["placement=da", "split=0.5", "hardware.hosts=2", "steps=3", "profile_steps=[0]"]
    assert compose_config(da).profile_steps == [0]  # each actor traces its side


# A value each dataset source key could take (every one differs from its default).
SOURCE_VALUES = {
    "path": "json",
    "name": "main",
    "revision": "abc",
    "data_files": "rows.jsonl",
    "eval_data_files": "test.jsonl",
    "train_split": "all",
    "eval_split": "null",
    "max_train_rows": "10",
    "thinking": "true",
    "long_prompts": "drop",
    "prompt_template": "'Q: {problem}'",
    "reward_workers": "2",
}


@pytest.mark.parametrize("key", SOURCE_VALUES)
def test_a_source_key_under_the_synthetic_task_is_refused_naming_key_value_and_valid(key):
    with pytest.raises(ConfigError) as refused:
        compose_config([f"dataset.{key}={SOURCE_VALUES[key]}"])
    message = str(refused.value)
    assert message.startswith(f"dataset.{key}=") and "dataset=synthetic" in message
    assert "leave it at" in message and "gsm8k" in message and len(message.splitlines()) == 1


def test_task_keys_of_another_kind_are_refused_and_each_kind_keeps_its_own():
    with pytest.raises(ConfigError, match=r"dataset.synthetic.num_digits=4 is not read by "):
        compose_config(["dataset=gsm8k", "dataset.synthetic.num_digits=4"])
    with pytest.raises(
        ConfigError, match=r"dataset.random_tokens.train_size=9 .* dataset=random_tokens"
    ):
        compose_config(["dataset.random_tokens.train_size=9"])
    with pytest.raises(
        ConfigError,
        match=r"dataset.prompt_template='Q: {problem}' is not read by this run \(dataset=swe_agent",
    ):
        compose_config(["dataset=swe_agent", "dataset.prompt_template='Q: {problem}'"])
    assert compose_config(["dataset=gsm8k", "dataset.thinking=true"]).dataset.thinking
    assert compose_config(["dataset.synthetic.num_digits=4"]).dataset.synthetic.num_digits == 4
    assert compose_config(["dataset=swe_agent", "dataset.reward_workers=2"]).dataset.reward_workers


def test_eval_size_has_one_meaning_the_synthetic_held_out_split_its_own_name():
    config = compose_config(["dataset.eval_size=5", "dataset.synthetic.held_out_size=50"])
    assert (config.dataset.eval_size, config.dataset.synthetic.held_out_size) == (5, 50)
    with pytest.raises(Exception, match="dataset.synthetic.eval_size"):
        compose_config(["dataset.synthetic.eval_size=50"])


def test_an_option_file_holding_a_list_is_refused(tmp_path):
    from locoexp.compose import _load_option

    (tmp_path / "bad.yaml").write_text("- chip: cpu\n")
    with pytest.raises(ConfigError, match="holds a list; a config option is a mapping"):
        _load_option(tmp_path / "bad.yaml")
