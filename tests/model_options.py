"""Test helper: a `conf/model/<name>.yaml` option converted to the typed `ModelConfig`."""

import pathlib

from omegaconf import OmegaConf

from locoexp.model.config import ModelConfig

MODEL_CONF = pathlib.Path(__file__).resolve().parents[1] / "conf" / "model"


def load_model_option(name: str) -> ModelConfig:
    """Merge the YAML option over the schema, as Hydra's config group does, and convert it."""
    option = OmegaConf.load(MODEL_CONF / f"{name}.yaml")
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), option)
    return OmegaConf.to_object(merged)
