"""The Ray side of `placement=da`: one actor per host wrapping a half, and their lifetimes.

- `RolloutHost` wraps a `RolloutHalf` (its own engine over its own devices); it never joins the
  trainer's `jax.distributed` group. Published weights reach it through Ray's object store (dL).
- `TrainerHost` wraps a `TrainerHalf`: the trainer hosts form their own `jax.distributed` group
  (gloo on CPU, coordinator on trainer 0 at `hardware.coordinator_port`, or a free port), fetch
  every rollout host's batch (transfer), train FSDP, and the leader puts one host copy of the new
  weights into the object store (publication, dpub). Each trainer host saves and restores its own
  shards of the training state (`locoexp.checkpoint.state.RunCheckpoints`, orbax) and exports
  the policy, when the driver asks.

Lifetimes (issue 13, runs that survive): a rollout host holds nothing that is not rebuilt from
the config and the published weights, so Ray restarts its actor after its process dies
(`max_restarts=placement.rollout_restarts`; `__init__` runs again and builds a fresh half); the
driver then asks it for the lost work again (`transport.py`). A trainer host holds the
training state, which only a checkpoint restores, so it is never restarted.

The halves come from this module's factories (`build_actor_rollout_half`,
`build_actor_trainer_half`) bound to a `RunSpec`'s `HalvesSpec`, which Ray ships to the actors;
they build with `placement.build`'s builders, as in-process. This module never reads a config
and never decides the schedule (`loop.py` does).
Actors start with the driver's `XLA_FLAGS`, their device count set to `devices_per_host`.

Ray itself (a local cluster, or a joined one) is started and stopped by `session.py`.
"""

import contextlib
import dataclasses
import functools
import ipaddress
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import ray
from flax import nnx
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from locoexp.checkpoint.progress import RunProgress
from locoexp.checkpoint.state import RunCheckpoints
from locoexp.dataset.build import build_task
from locoexp.errors import ConfigError
from locoexp.layout import Layout
from locoexp.metrics.breakdown import StepProfiler, exchange_annotation
from locoexp.metrics.steady import WARMUP_STEPS
from locoexp.metrics.timing import StepTimer, host_orchestration_s
from locoexp.model.checkpoint import load_model
from locoexp.model.config import ModelConfig
from locoexp.placement.build import build_rollout_half, build_trainer_half
from locoexp.placement.coordinator import CoordinatorSpec
from locoexp.placement.halves import (
    HalfReport,
    Published,
    RolloutBatch,
    RolloutHalf,
    TrainerHalf,
    TrainResult,
)
from locoexp.placement.launch import (
    cpu_device_flags,
    free_port,
    host_port,
    initialize_distributed,
)
from locoexp.placement.loop import freeze_gc
from locoexp.placement.multihost import HostGroup, gather_for_engine
from locoexp.placement.phases import load_into_engine
from locoexp.placement.ray.spec import RaySpec
from locoexp.placement.settings import HalvesSpec
from locoexp.tokenizer.protocol import Tokenizer
from locoexp.trainer.trainer import Trainer


def side_report(report: HalfReport, timer: StepTimer, side: str) -> HalfReport:
    """A half's report with the actor's timings; its step time is `timing/<side>_s`, its compile
    seconds `timing/<side>_compile_s` (the driver's own `timing/compile_s` would overwrite them)."""
    times = timer.metrics()
    times[f"timing/{side}_host_orchestration_s"] = host_orchestration_s(times)
    times[f"timing/{side}_s"] = times.pop("timing/step_s")
    times[f"timing/{side}_compile_s"] = times.pop("timing/compile_s")
    del times["timing/unaccounted_s"]
    return HalfReport({**report.metrics, **times}, report.window)


@contextlib.contextmanager
def side_profile(profiler: StepProfiler, step: int) -> Iterator[dict[str, float]]:
    """Trace the enclosed call if `step` is profiled; afterwards the dict yielded holds its
    `breakdown/<side>_*` (side: the profiler's role, trainer or rollout; Table H1's split of
    this actor's own call, on its own devices) and `breakdown/<side>_profile_s`, the seconds the
    trace's stop and parse took inside the call (they delay what waits for this actor). Empty
    for a step not profiled."""
    side = profiler.role
    metrics: dict[str, float] = {}
    with profiler.capture(step):
        yield metrics
        end = time.perf_counter()
    for key, value in profiler.metrics(step).items():  # breakdown/compute_share -> ..._share
        metrics[key.replace("breakdown/", f"breakdown/{side}_", 1)] = value
    if metrics:
        metrics[f"breakdown/{side}_profile_s"] = time.perf_counter() - end


def with_metrics(report: HalfReport, extra: dict[str, float]) -> HalfReport:
    return HalfReport({**report.metrics, **extra}, report.window) if extra else report


class _Actor:
    """O2 (Table B1) in an actor: gc frozen once its warm-up calls (`metrics.steady`) ran."""

    freeze_after_warmup: bool = False
    calls: int = 0

    def _count_call(self) -> None:
        self.calls += 1
        if self.calls == WARMUP_STEPS + 1 and self.freeze_after_warmup:
            freeze_gc()


class RolloutHost(_Actor):
    def __init__(
        self,
        build: Callable[..., RolloutHalf],
        *,
        index: int,
        hosts: int,
        freeze: bool,
        profiler: StepProfiler,
    ):
        self.timer, self.freeze_after_warmup, self.profiler = StepTimer(), freeze, profiler
        self.half = build(host=index, hosts=hosts, timer=self.timer)

    def generate(self, step: int, published: Published) -> tuple[HalfReport, RolloutBatch]:
        """Batch `step`'s share of this host: (report for the driver, batch for the trainers);
        a profiled step's generation traced to `profile/step<step>/rollout<index>/`."""
        self._count_call()
        with side_profile(self.profiler, step) as breakdown, self.timer.step():
            batch = self.half.run(step, published)
        report = with_metrics(side_report(batch.report, self.timer, "rollout"), breakdown)
        return report, dataclasses.replace(batch, report=report)

    def evaluate(self, published: Published, *, limit: int | None) -> tuple[int, int]:
        return self.half.evaluate(published, limit=limit)


class TrainerHost(_Actor):
    """Trainer host `index` of `hosts`; `join` forms the trainer's own jax.distributed group."""

    def __init__(self, *, index: int, hosts: int):
        self.index, self.hosts = index, hosts
        self.checkpoints: RunCheckpoints | None = None  # opened by the first save or restore

    def coordinator_address(self, port: int, bind_address: str | None) -> str:
        """Where the trainer group reaches its coordinator (called on host 0 only): this node's
        address, and `port` or one free on the interface the coordinator will bind to."""
        node = ray.util.get_node_ip_address()
        return host_port(node, port or free_port(bind_address or node))

    def join(
        self,
        coordinator: str,
        build: Callable[..., TrainerHalf],
        *,
        freeze: bool,
        bind_address: str | None,
        profiler: StepProfiler,
    ) -> int:
        """Join the group and build the trainer half on its devices; returns the device count.
        `bind_address` None: this node's address (a joined cluster: each node its own)."""
        initialize_distributed(
            coordinator=coordinator if self.hosts > 1 else None,
            num_processes=self.hosts,
            process_id=self.index,
            bind_address=bind_address or ray.util.get_node_ip_address(),
        )
        self.timer, self.freeze_after_warmup, self.profiler = StepTimer(), freeze, profiler
        self.half = build(group=HostGroup.current(), timer=self.timer)
        return self.half.trainer.devices

    def train(self, step: int, batches: list) -> TrainResult:
        """Step `step` on every rollout host's batch (ObjectRefs, fetched here: transfer). A
        checkpoint that failed in the background since the last call ends the run here, with
        its sentence (`RunCheckpoints.check`), as the co loop's check each step does. A profiled
        step is traced to `profile/step<step>/trainer<index>/`."""
        if self.checkpoints is not None:
            self.checkpoints.check()
        self._count_call()
        with side_profile(self.profiler, step) as breakdown, self.timer.step():
            with self.timer.phase("transfer"), exchange_annotation("ray_get_batches"):
                fetched = ray.get(batches)
            result = self.half.train(step, fetched)
        report = side_report(result.report, self.timer, "trainer")
        return dataclasses.replace(result, report=with_metrics(report, breakdown))

    def _checkpoints(self, run_dir: str) -> RunCheckpoints:
        if self.checkpoints is None:  # every trainer host opens it in the same call
            self.checkpoints = RunCheckpoints(run_dir)
        return self.checkpoints

    def save_checkpoint(self, run_dir: str, progress: RunProgress, *, wait: bool) -> None:
        """This host's shards of the training state; the group's process 0 writes `progress`.
        Asynchronous unless `wait` (`RunCheckpoints.save`)."""
        self.half.save(self._checkpoints(run_dir), progress, wait=wait)

    def restore_checkpoint(self, run_dir: str, step: int) -> Published | None:
        """Continue from the checkpoint after `step` updates; the restored weights are published
        (the leader returns them, versioned `step`)."""
        return self.half.restore(self._checkpoints(run_dir), step)

    def export_policy(self, directory: str, model: ModelConfig, tokenizer: Tokenizer) -> None:
        """The policy as a Hugging Face directory (every trainer host calls; process 0 writes)."""
        self.half.export(directory, model=model, tokenizer=tokenizer)

    def close_checkpoints(self) -> None:
        """Wait for an asynchronous save still being written, before the actor is stopped."""
        if self.checkpoints is not None:
            self.checkpoints.close()
            self.checkpoints = None


def publish_to_object_store(trainer: Trainer, *, one_call: bool, dtype=None) -> Published | None:
    """All-gather the new weights on every trainer host (O4: in one program, else per layer),
    cast to the engines' `dtype` (a bf16 sampler gets half the bytes, Table I3); the leader puts
    one host copy into the object store, versioned by updates applied."""
    local = gather_for_engine(
        trainer.params, trainer.mesh, jax.local_devices(), one_call=one_call, dtype=dtype
    )
    if jax.process_index() != 0:
        jax.block_until_ready(local)
        return None
    host_copy = jax.tree.map(np.asarray, local)
    with exchange_annotation("ray_put_weights"):
        return Published(trainer.steps_done, ray.put(nnx.to_pure_dict(host_copy)))


def load_from_object_store(engine, published: Published, *, template, one_call: bool) -> None:
    """dL: fetch `published` and load it into the engine (O4: in one call, else per layer).
    `template` is the engine's parameter tree as shapes, filled in place."""
    with exchange_annotation("ray_get_weights"):
        weights = ray.get(published.weights)
    nnx.replace_by_pure_dict(template, weights)
    load_into_engine(engine, template, one_call=one_call)


@dataclasses.dataclass(kw_only=True)
class Hosts:
    """The run's actor handles (and their placement group), in host order per side."""

    trainers: list = dataclasses.field(default_factory=list)
    rollouts: list = dataclasses.field(default_factory=list)
    group: Any = None

    def stop(self) -> None:
        for actor in self.trainers + self.rollouts:
            ray.kill(actor, no_restart=True)
        if self.group is not None:
            remove_placement_group(self.group)


def start_hosts(
    hosts: Hosts,
    layout: Layout,
    cluster: RaySpec,
    meet: CoordinatorSpec,
    *,
    build_rollout: Callable[..., RolloutHalf],
    build_trainer: Callable[..., TrainerHalf],
    freeze: bool,
    profiler: StepProfiler,
) -> None:
    """One actor per host (`host_places`); the trainer group joins on trainer 0's coordinator,
    which listens on `hardware.bind_address` in a local cluster, on its node's address in a
    joined one (each actor binds to its own node's address: `ray start --node-ip-address`).
    `profiler`: the run's profiled steps; each actor traces its own side of them."""
    places = host_places(hosts, layout, cluster)
    env = {}
    if layout.cpu:
        env = {"XLA_FLAGS": cpu_device_flags(layout.devices_per_host), "JAX_PLATFORMS": "cpu"}

    def options(host: int, **restarts) -> dict:
        runtime_env = {"env_vars": env}
        return dict(
            num_cpus=1, runtime_env=runtime_env, scheduling_strategy=places[host], **restarts
        )

    trainer_cls, rollout_cls = ray.remote(TrainerHost), ray.remote(RolloutHost)
    for i in range(layout.trainer_hosts):
        hosts.trainers.append(
            trainer_cls.options(**options(i)).remote(index=i, hosts=layout.trainer_hosts)
        )
    for i in range(layout.rollout_hosts):
        hosts.rollouts.append(
            rollout_cls.options(
                **options(layout.trainer_hosts + i, max_restarts=cluster.rollout_restarts)
            ).remote(
                build_rollout,
                index=i,
                hosts=layout.rollout_hosts,
                freeze=freeze,
                profiler=dataclasses.replace(profiler, role="rollout", index=i),
            )
        )
    port = meet.port
    bind = None if cluster.joined else meet.bind_address
    coordinator = ray.get(hosts.trainers[0].coordinator_address.remote(port, bind))
    joined = [
        t.join.remote(
            coordinator,
            build_trainer,
            freeze=freeze,
            bind_address=bind,
            profiler=dataclasses.replace(profiler, role="trainer", index=i),
        )
        for i, t in enumerate(hosts.trainers)
    ]
    ray.get(joined + [r.__ray_ready__.remote() for r in hosts.rollouts])


def host_places(hosts: Hosts, layout: Layout, cluster: RaySpec) -> list:
    """Where each host's actor runs, trainers first. A local cluster: one placement-group bundle
    per host (Ray restarts an actor in its bundle). A joined cluster (`placement.ray_address`):
    one node per host, the trainer hosts on the driver's node first, then every node by address;
    each actor prefers its node (soft affinity), so Ray restarts a rollout host whose node was
    lost on any node with a free CPU (a trainer host is never restarted: its state is the
    checkpoint's, and on the driver's node it shares the driver's fate)."""
    count = layout.trainer_hosts + layout.rollout_hosts
    if not cluster.joined:
        hosts.group = placement_group([{"CPU": 1}] * count, strategy="PACK")
        ray.get(hosts.group.ready())
        return [
            PlacementGroupSchedulingStrategy(hosts.group, placement_group_bundle_index=b)
            for b in range(count)
        ]
    here = ray.get_runtime_context().get_node_id()
    nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1]
    nodes.sort(key=lambda n: (n["NodeID"] != here, ipaddress.ip_address(n["NodeManagerAddress"])))
    if len(nodes) < count:
        raise ConfigError(
            f"placement.ray_address={cluster.address} has {len(nodes)} live node(s) with a "
            f"CPU, and placement=da places its {count} hosts (hardware.hosts) one per node: "
            f"start {count - len(nodes)} more node(s) (`ray start --address=...`) or lower "
            "hardware.hosts."
        )
    return [NodeAffinitySchedulingStrategy(n["NodeID"], soft=True) for n in nodes[:count]]


def build_actor_rollout_half(halves: HalvesSpec, **half) -> RolloutHalf:
    """Called in a `da` rollout actor: its own task, policy, engine and object-store loader."""
    policy = load_model(halves.model, seed=halves.settings.seed)
    # what published pure dicts are loaded into: shapes only, so the initial weights live once
    template = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), nnx.split(policy, nnx.Param)[1]
    )
    one_call = halves.settings.opt.publish_in_one_call
    load = functools.partial(load_from_object_store, template=template, one_call=one_call)
    model = halves.model
    task = build_task(halves.dataset, tokenizer_dir=model.checkpoint, vocab_size=model.vocab_size)
    return build_rollout_half(policy, task, halves, load=load, settings=halves.settings, **half)


def build_actor_trainer_half(halves: HalvesSpec, *, group: HostGroup, **half) -> TrainerHalf:
    """Called in a `da` trainer actor once it joined the trainer group: its share of every
    batch, publishing through the object store in the rollout engines' dtype."""
    one_call = halves.settings.opt.publish_in_one_call
    dtype = jnp.dtype(halves.sampler_dtype.value)
    return build_trainer_half(
        load_model(halves.model, seed=halves.settings.seed),
        halves,
        group=group,
        publish=functools.partial(publish_to_object_store, one_call=one_call, dtype=dtype),
        share=(group.index, group.count),
        settings=halves.settings,
        **half,
    )
