"""Shared fixtures: composing the real Hydra config the way `run.py` does, and one 2-host `co`
run that several modules read. Under pytest-xdist (`-n 2 --dist loadgroup`, pyproject.toml) each
module runs on one worker, so its module-scoped fixtures run once; tests sharing a session
fixture name one `xdist_group`."""

import pytest
from cli_runs import RESUMABLE, run_and_watch

from locoexp.compose import compose_config


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items):
    """A test without an `xdist_group` joins its module's group (one worker per module)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.fixture
def compose():
    """compose(overrides) -> the typed Config of `python run.py <overrides>`."""
    return compose_config


@pytest.fixture(scope="session")
def two_host_co_run(tmp_path_factory):
    """`python run.py` on 2 local hosts under co, resumable (checkpoints every 2 steps), with
    every listening socket of its process tree seen while it ran: test_resume_run's reference
    for a killed 2-host run, test_loopback's co run."""
    run_dir = tmp_path_factory.mktemp("two_host_co") / "run"
    return run_and_watch(run_dir, [*RESUMABLE, "hardware.hosts=2"], deadline_s=420)
