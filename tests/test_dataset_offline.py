"""Start-up with a dataset that cannot be loaded: one ConfigError sentence, nothing global set."""

import os
import subprocess
import sys

import pytest
from dataset_options import REPO, dataset_option

from locoexp.dataset.build import build_task
from locoexp.errors import ConfigError

OFFLINE_BUILD = """
from locoexp.dataset.build import build_task
from locoexp.errors import ConfigError
from tests.dataset_options import dataset_option
try:
    build_task(dataset_option({name!r}))
except ConfigError as err:
    print("CONFIG_ERROR:", err)
"""


@pytest.mark.parametrize("name", ["gsm8k", "swe_agent"])
def test_offline_without_local_files_names_the_dataset_and_the_key(name):
    # The hub's offline switch fails fast instead of retrying DNS for half a minute; it is set
    # in the child process only.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", OFFLINE_BUILD.format(name=name)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("CONFIG_ERROR:")]
    assert lines, result.stdout + result.stderr
    message = lines[0]
    assert f"dataset {name} is missing" in message and "dataset.data_files" in message
    print("\n" + message)


def test_local_files_that_do_not_exist_are_refused(tmp_path):
    config = dataset_option("gsm8k", data_files=str(tmp_path / "nope" / "train.jsonl"))
    with pytest.raises(ConfigError, match="dataset.data_files=.*matches no readable file"):
        build_task(config)


def test_unknown_file_extension_asks_for_the_builder(tmp_path):
    (tmp_path / "rows.xyz").write_text("{}")
    with pytest.raises(ConfigError, match="name the builder in dataset.path"):
        build_task(dataset_option("gsm8k", data_files=str(tmp_path / "rows.xyz")))


@pytest.mark.parametrize("source", [{"path": None}, {"train_split": ""}])
def test_a_dataset_without_a_training_split_is_refused(source):
    # was None rows, then an AttributeError or TypeError deep in the task's build
    with pytest.raises(ConfigError, match="has no training split: set dataset.data_files"):
        build_task(dataset_option("gsm8k", **source))
