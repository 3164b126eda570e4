"""Shared fixtures: composing the real Hydra config the way `run.py` does."""

import pytest

from locoexp.compose import compose_config


@pytest.fixture
def compose():
    """compose(overrides) -> the typed Config of `python run.py <overrides>`."""
    return compose_config
