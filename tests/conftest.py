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
    return run_module.compose_config
