"""Test helpers: a `conf/dataset/<name>.yaml` option as the typed `DatasetConfig`, the shared
real-data folder (`../shared/data` beside the repository, or $LOCOEXP_SHARED_DATA), completions."""

import os
import pathlib

import numpy as np
import pytest
from omegaconf import OmegaConf

from locoexp.dataset.config import DatasetConfig

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = pathlib.Path(os.environ.get("LOCOEXP_SHARED_DATA", REPO.parent / "shared" / "data"))


def dataset_option(name: str, **overrides) -> DatasetConfig:
    """The YAML option merged over the schema with command-line-style overrides, as Hydra does."""
    option = OmegaConf.load(REPO / "conf" / "dataset" / f"{name}.yaml")
    merged = OmegaConf.merge(OmegaConf.structured(DatasetConfig), option, overrides)
    return OmegaConf.to_object(merged)


def shared_data(relative: str) -> pathlib.Path:
    """A path in the shared real-data folder; the test is skipped, saying why, when it is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(
            f"real data {path} is absent (a fresh clone without ../shared/data); "
            f"set LOCOEXP_SHARED_DATA to the folder that holds it"
        )
    return path


def completion(tokenizer, text: str) -> np.ndarray:
    """A finished response: the text's tokens followed by EOS, as the engine returns them."""
    return np.asarray([*tokenizer.encode(text), tokenizer.eos_id], np.int32)


def prompt_length_stats(task, name: str) -> np.ndarray:
    lengths = np.array([len(e.prompt_tokens) for e in task.train])
    print(
        f"\n{name}: {len(lengths)} prompts, Qwen3 tokens min {lengths.min()} median "
        f"{np.median(lengths):.0f} mean {lengths.mean():.1f} p95 {np.percentile(lengths, 95):.0f} "
        f"max {lengths.max()}; over the cap: {task.long_prompts}"
    )
    return lengths
