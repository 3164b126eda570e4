"""Shared fixtures: composing the real Hydra config the way `run.py` does."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import run as run_module  # noqa: E402  (registers the config schema in Hydra's ConfigStore)


@pytest.fixture
def compose():
    """compose(overrides) -> the typed Config of `python run.py <overrides>`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    def _compose(overrides=()):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            return run_module.to_config(
                hydra_compose(config_name="config", overrides=list(overrides))
            )

    return _compose
