"""Shared fixtures: composing the real Hydra config the way `run.py` does, and one 2-host `co`
run that several modules read. Under pytest-xdist (`-n 2 --dist loadgroup`, pyproject.toml) each
module runs on one worker, so its module-scoped fixtures run once; tests sharing a session
fixture name one `xdist_group`.

Every process of one session (xdist workers, `python run.py` subprocesses, their hosts and Ray
actors) shares one persistent XLA compilation cache in a fresh temporary directory: the suite
compiles the same tiny programs in dozens of processes, and a process that finds one compiled
loads it instead (the same `JAX_COMPILATION_CACHE_DIR` a user can set for a sweep, README). It
is this session's own directory, removed at its end; a cache set by the caller is kept."""

import os
import shutil
import tempfile

import pytest
from cli_runs import kill_and_resume
from step_loop_reference import REFERENCE, overrides_of

from locoexp.compose import compose_config

_CACHE_OWNER = "LOCOEXP_TEST_XLA_CACHE_OWNER"
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # the first process of the session (before jax)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="locoexp-tests-xla-")
    os.environ[_CACHE_OWNER] = str(os.getpid())
    # cache every program: the suite's are small and quick to compile, but there are many
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


# LLVM's optimisation of the CPU code is most of each compile and buys nothing for programs this
# small that run a few times; XLA's HLO passes (fusion, buffer assignment, what the planner is
# checked against) and every tested value stay as they are. Workers, hosts and Ray actors inherit
# the flags (`launch.cpu_device_flags`); a level the caller chose is kept.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        [
            os.environ.get("XLA_FLAGS", ""),
            "--xla_backend_optimization_level=0",
            "--xla_llvm_disable_expensive_passes=true",
        ]
    ).strip()

# JAX's CPU backend alone, as `python run.py` uses on CPU (`compose.use_cpu_backend`): libtpu,
# which the test extra installs for the XLA-TPU compiles, would otherwise be tried first.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# What decides the device count of every in-process test; a test module must not change it when
# it is imported (a worker script sets its own before jax starts: import its cases, not it).
_DEVICE_ENV = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES")
_DEVICE_ENV_AT_START = {name: os.environ.get(name) for name in _DEVICE_ENV}


def pytest_collection_finish(session):
    changed = {
        name: os.environ.get(name)
        for name in _DEVICE_ENV
        if os.environ.get(name) != _DEVICE_ENV_AT_START[name]
    }
    if changed:
        raise pytest.UsageError(
            f"collecting the tests changed {changed} (was {_DEVICE_ENV_AT_START}): a module "
            "imported at collection sets the device count of every later in-process test"
        )


def pytest_unconfigure(config):
    if os.environ.get(_CACHE_OWNER) == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items):
    """A test without an `xdist_group` joins its module's group (one worker per module). Groups
    holding a `slow` test go first (xdist hands out groups in collection order,
    `--no-loadscope-reorder`): the multi-process runs start at once on both workers and the
    many quick tests fill in behind them, instead of one long run finishing the suite alone."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    group = {id(item): item.get_closest_marker("xdist_group").args[0] for item in items}
    slow = {group[id(item)] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: group[id(item)] not in slow)  # stable: file order within each


@pytest.fixture
def compose():
    """compose(overrides) -> the typed Config of `python run.py <overrides>`."""
    return compose_config


@pytest.fixture(scope="session")
def two_host_co_run(tmp_path_factory):
    """`python run.py` on 2 local hosts under co with test_step_loop's golden overrides and a
    checkpoint every step, killed with SIGKILL after a random step and started again with the
    same command, every listening socket of both attempts seen: test_resume_run's kill -9 test
    (held to the golden records) and finished run started again, test_loopback's co run."""
    run_dir = tmp_path_factory.mktemp("two_host_co") / "run"
    args = [*overrides_of("co_2hosts"), "checkpoint_every_steps=1"]
    steps = len(REFERENCE["runs"]["co_2hosts"]["steps"]["train/loss"])
    return kill_and_resume(run_dir, args, steps=steps)
