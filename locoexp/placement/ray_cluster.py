"""The Ray side of `placement=da`: start Ray (a local cluster on 127.0.0.1, or join one), place
one actor per host in a placement group, form the trainer's `jax.distributed` group, and stop
every actor. It owns actor lifetimes only; the step schedule is `disaggregated.py`'s.

Loopback: Ray turns a node address of 127.0.0.1 into the machine's routable address (so its
gcs_server, raylet, workers and autoscaler monitor listen on every interface) unless it treats
the machine as a one-node cluster, which its `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` switch selects
on any platform. A local cluster bound to loopback sets it, no dashboard is started, and every
Ray service then listens on 127.0.0.1 only.
"""

import dataclasses
import ipaddress
import logging
import os
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from locoexp.algo.config import AlgoConfig
from locoexp.dataset.config import DatasetConfig
from locoexp.dataset.schedule import PromptSchedule
from locoexp.model.config import ModelConfig
from locoexp.placement.phases import StepSettings
from locoexp.placement.ray_actors import RolloutHost, TrainerHost
from locoexp.rollout.config import RolloutConfig
from locoexp.trainer.config import TrainerConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class DaLayout:
    """Who runs where: host counts per side, devices per host, and the Ray cluster to use."""

    trainer_hosts: int
    rollout_hosts: int
    devices_per_host: int
    cpu_devices: bool  # hardware=cpu: each actor gets its devices through XLA_FLAGS
    ray_address: str | None  # None: a local cluster on 127.0.0.1
    bind_address: str | None  # the interface listening sockets bind to; None: all


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostParts:
    """What the actors are built from (sub-configs and runtime objects, never the root config)."""

    model: ModelConfig
    rollout: RolloutConfig
    dataset: DatasetConfig
    algo: AlgoConfig
    trainer: TrainerConfig
    settings: StepSettings
    schedule: PromptSchedule


@dataclasses.dataclass(kw_only=True)
class Hosts:
    """The run's actor handles (and their placement group), in host order per side."""

    trainers: list = dataclasses.field(default_factory=list)
    rollouts: list = dataclasses.field(default_factory=list)
    group: Any = None

    def generate(self, step: int, published: list) -> list:
        """Batch `step` on every rollout host: [(metrics ref, data ref)] per host."""
        return [r.generate.options(num_returns=2).remote(step, published) for r in self.rollouts]

    def stop(self) -> None:
        for actor in self.trainers + self.rollouts:
            ray.kill(actor, no_restart=True)
        if self.group is not None:
            remove_placement_group(self.group)


def start_ray(layout: DaLayout) -> None:
    options = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=True)
    if layout.bind_address is not None:
        options["_node_ip_address"] = layout.bind_address
    if layout.ray_address is None:
        if layout.bind_address and ipaddress.ip_address(layout.bind_address).is_loopback:
            _keep_ray_on_loopback()
        hosts = layout.trainer_hosts + layout.rollout_hosts
        ray.init(address="local", num_cpus=hosts, **options)
    else:
        ray.init(address=layout.ray_address, **options)


def _keep_ray_on_loopback() -> None:
    """Make Ray keep node address 127.0.0.1 (module docstring): the environment switch for the
    processes Ray starts, and the constant this process read when it imported Ray."""
    from ray._private import ray_constants  # noqa: PLC0415

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def start_hosts(hosts: Hosts, layout: DaLayout, parts: HostParts) -> None:
    """One actor per host in one placement group (one bundle per host; spread over nodes when
    joining a real cluster); the trainer group joins on trainer 0's coordinator."""
    count = layout.trainer_hosts + layout.rollout_hosts
    group = placement_group(
        [{"CPU": 1}] * count, strategy="PACK" if layout.ray_address is None else "STRICT_SPREAD"
    )
    hosts.group = group
    ray.get(group.ready())
    env = {}
    if layout.cpu_devices:
        flag = f"--xla_force_host_platform_device_count={layout.devices_per_host}"
        env = {"XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}

    def options(bundle: int) -> dict:
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)
        return dict(num_cpus=1, runtime_env={"env_vars": env}, scheduling_strategy=strategy)

    trainer_cls, rollout_cls = ray.remote(TrainerHost), ray.remote(RolloutHost)
    for i in range(layout.trainer_hosts):
        actor = trainer_cls.options(**options(i)).remote(index=i, hosts=layout.trainer_hosts)
        hosts.trainers.append(actor)
    for i in range(layout.rollout_hosts):
        actor = rollout_cls.options(**options(layout.trainer_hosts + i)).remote(
            index=i,
            hosts=layout.rollout_hosts,
            model=parts.model,
            rollout=parts.rollout,
            dataset=parts.dataset,
            schedule=parts.schedule,
            settings=parts.settings,
        )
        hosts.rollouts.append(actor)
    coordinator = ray.get(hosts.trainers[0].coordinator_address.remote(layout.bind_address))
    joined = [
        t.join.remote(
            coordinator,
            bind_address=layout.bind_address,
            model=parts.model,
            algo=parts.algo,
            trainer=parts.trainer,
            settings=parts.settings,
            temperature=parts.settings.sampling.temperature,
        )
        for t in hosts.trainers
    ]
    ray.get(joined + [r.__ray_ready__.remote() for r in hosts.rollouts])
