"""Every option of `conf/` composes and converts to the typed `Config`; bad input fails at start-up
with one sentence naming the key, exit code 2, no traceback and no run directory."""

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from locoexp.compose import compose_config, preflight
from locoexp.config import Config
from locoexp.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
OPTIONS = sorted(
    (group.name, option.stem)
    for group in CONF.iterdir()
    if group.is_dir()
    for option in group.glob("*.yaml")
)
# Options that are only valid together with another choice (cross-group checks of Config).
COMPANIONS = {
    ("placement", "da"): ["hardware=tpu_v7x_16", "split=0.5"],  # da needs >= 2 hosts and a split
    ("hardware", "tpu_v7x_256"): ["dataset=gsm8k"],  # 64 hosts need prompts_per_step % 64 == 0
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
    assert compose_config(["hardware.coordinator_port=1234"]).hardware.coordinator_port == 1234


def test_appended_unknown_key_is_refused_before_the_run():
    with pytest.raises(Exception, match="nonexistent_key"):
        preflight(["+nonexistent_key=1"])


def test_profile_steps_outside_the_run_or_under_da_are_refused():
    assert compose_config(["steps=3", "profile_steps=[0,2]"]).profile_steps == [0, 2]
    with pytest.raises(ConfigError, match=r"profile_steps=\[3\] must lie in \[0, steps=3\)"):
        compose_config(["steps=3", "profile_steps=[3]"])
    with pytest.raises(ConfigError, match="not supported under placement=da"):
        compose_config(["placement=da", "split=0.5", "hardware.hosts=2", "profile_steps=[0]"])
