"""`RunSpec` (`locoexp.session`): built once from the config, frozen, jax-free, one layout for
every placement; every transport offers the whole `Transport` Protocol."""

import dataclasses
import inspect
import pickle
import subprocess
import sys

import pytest

from locoexp.compose import compose_config
from locoexp.errors import ConfigError
from locoexp.layout import PlacementKind, TransportKind, build_layout
from locoexp.placement.transport import Transport
from locoexp.session.build import build_spec
from locoexp.session.lifecycle import OPEN_TRANSPORT


@pytest.mark.parametrize("module", ["locoexp.session.spec", "locoexp.layout"])
def test_the_spec_and_the_layout_import_no_jax(module):
    code = f"import sys, {module}; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_spec_is_frozen_picklable_and_carries_the_plans_sizes():
    spec = build_spec(compose_config([]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.loop = None  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(spec)) == spec
    # the plan resolves what 0 leaves open (rollout.capacity, trainer.micro_batch_rows)
    assert spec.halves.rollout.capacity > 0 and spec.halves.trainer.micro_batch_rows > 0
    assert spec.loop.steps == spec.survival.steps


DA_BATCH = ["dataset.prompts_per_step=3"]  # a whole group per rollout host


@pytest.mark.parametrize(
    ("overrides", "processes", "trainers", "rollouts", "staleness", "properties"),
    [
        (["placement=co", "hardware.hosts=2"], 2, 2, 2, 0, ("colocated", "on_policy")),
        (
            ["placement=single_controller", "hardware.hosts=2"],
            *(1, 2, 2, 0),
            ("colocated", "on_policy", "lockstep"),
        ),
        (
            ["placement=da", "hardware.hosts=4", "split=0.25", "dataset.prompts_per_step=3"],
            *(0, 1, 3, 1),
            ("disaggregated",),
        ),
    ],
)
def test_one_layout_says_who_runs_where_for_every_placement(
    overrides, processes, trainers, rollouts, staleness, properties
):
    spec = build_spec(compose_config(overrides))
    layout = spec.layout
    assert (layout.processes, layout.trainer_hosts, layout.rollout_hosts) == (
        processes,
        trainers,
        rollouts,
    )
    asked = ("colocated", "disaggregated", "on_policy", "lockstep")
    assert {p for p in asked if getattr(layout, p)} == set(properties)
    assert spec.loop.staleness == layout.staleness == staleness
    assert spec.coordinator.bind_address == "127.0.0.1"  # a local run listens on loopback only
    ray = layout.transport is TransportKind.ray
    assert ray == layout.disaggregated  # actors apart need a transport between processes
    if layout.disaggregated:
        assert spec.ray and spec.ray.object_store_bytes and layout.local_processes == 5  # + driver
    else:
        assert spec.ray is None  # no Ray where the layout is colocated


def _members(cls) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")}


@pytest.mark.parametrize("module", ["inprocess", "ray.transport"])
def test_every_transport_offers_the_whole_protocol(module):
    import importlib  # noqa: PLC0415

    cls = {"inprocess": "InProcess", "ray.transport": "RayActors"}[module]
    transport = getattr(importlib.import_module(f"locoexp.placement.{module}"), cls)
    wanted = _members(Transport) - _members(object)
    assert {"restore", "checkpoint", "export", "group"} <= wanted
    fields = {f.name for f in dataclasses.fields(transport)}
    assert wanted <= _members(transport) | fields
    properties = {n for n in wanted if isinstance(getattr(Transport, n), property)}
    assert {"group", "profiler"} <= properties
    for name in wanted - fields - properties:
        want = inspect.signature(getattr(Transport, name)).parameters
        have = inspect.signature(getattr(transport, name)).parameters
        assert list(have) == list(want), f"{cls}.{name}"


def test_the_session_opens_every_transport_a_layout_can_name():
    assert set(OPEN_TRANSPORT) == set(TransportKind)


def test_hosts_apart_are_refused_an_in_process_transport():
    apart = build_layout(PlacementKind.da, hosts=2, devices_per_host=1, split=0.5)
    with pytest.raises(ConfigError, match="need a transport between processes"):
        dataclasses.replace(apart, transport=TransportKind.in_process)
