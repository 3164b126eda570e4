"""`build_spec(config)`: the root `Config` -> a checked `RunSpec` (`spec.py`), and `plan_setup`,
what the memory plan reads. The one place besides `locoexp.main` that reads the root config; it
imports the planner (which counts parameters with `jax.eval_shape`), so `spec.py` stays jax-free.
"""

import dataclasses
import math
from typing import Any

from locoexp.checkpoint.progress import config_digest
from locoexp.config import Config
from locoexp.model.config import DType
from locoexp.placement.coordinator import CoordinatorSpec
from locoexp.placement.ray.spec import RaySpec
from locoexp.placement.settings import HalvesSpec, LoopPlan, StepSettings
from locoexp.planner import Plan, Setup, check_fit, resolved_micro_batch_rows
from locoexp.planner.estimate import publication_bytes
from locoexp.planner.plan import object_store_bytes, trainer_row_tokens
from locoexp.rollout.config import SamplingParams
from locoexp.session.spec import RunSpec, SurvivalSpec


def build_ray_spec(config: Config) -> RaySpec | None:
    """The Ray cluster of a disaggregated run (None: colocated, no Ray): the `placement` group's
    Ray keys and the local cluster's object store, sized to the published weights."""
    if config.layout.colocated:
        return None
    placement = config.placement
    return RaySpec(
        address=placement.ray_address,
        rollout_restarts=placement.rollout_restarts,
        rollout_restart_timeout_s=placement.rollout_restart_timeout_s,
        object_store_bytes=object_store_bytes(
            publication_bytes(config.model, sampler_dtype(config))
        ),
    )


def build_coordinator_spec(config: Config) -> CoordinatorSpec:
    """Where the run's processes meet: the `hardware` group's coordinator keys, listening on
    loopback unless the run spans machines (a joined Ray cluster, a cluster-started group, a
    TPU slice)."""
    hw = config.hardware
    return CoordinatorSpec(
        port=hw.coordinator_port,
        bind_address=hw.listen_address(multi_machine=config.placement.ray_address is not None),
        address=hw.coordinator_address,
        process_id=hw.process_id,
        timeout_s=hw.coordinator_timeout_s,
    )


def plan_setup(config: Config) -> Setup:
    """What the memory plan reads: the sub-configs and the layout."""
    c = config
    return Setup(
        model=c.model,
        hardware=c.resolved_hardware,
        rollout=c.rollout,
        dataset=c.dataset,
        trainer=c.trainer,
        layout=c.layout,
        kl_reference=c.algo.kl_coef > 0,
        adapter=c.adapter,
    )


def build_spec(config: Config, *, xla: Config | None = None) -> RunSpec:
    """The checked spec of a run: refuses (`ConfigError`, one sentence) a model that does not fit,
    a TP degree the heads do not allow, a placement the hosts cannot hold; resolves
    `trainer.micro_batch_rows=0` and `rollout.capacity=0` to the plan's sizes. `xla`: where this
    process compiled the run at start-up (`compiled.startup.judged`), the config XLA fits, whose
    verdict and sizes stand for the plan's."""
    config = xla or config
    setup = plan_setup(config)
    resolved = check_fit(setup, memory=xla is None)
    layout, c = setup.layout, config
    trainer = dataclasses.replace(
        c.trainer, micro_batch_rows=resolved_micro_batch_rows(c.trainer, resolved)
    )
    rollout = c.rollout.at_capacity(resolved.capacity, pool_pages=_pool_pages(resolved))
    halves = HalvesSpec(
        model=c.model,
        algo=c.algo,
        trainer=trainer,
        rollout=rollout,
        dataset=c.dataset,
        settings=build_settings(c, local_devices=layout.devices_per_process),
        sampler_dtype=sampler_dtype(c),
        adapter=c.adapter,
    )
    return RunSpec(
        layout=layout,
        ray=build_ray_spec(c),
        coordinator=build_coordinator_spec(c),
        loop=build_loop_plan(c, staleness=layout.staleness),
        halves=halves,
        survival=SurvivalSpec(
            resume=c.resume,
            checkpoint_every_steps=c.checkpoint_every_steps,
            steps=c.steps,
            seed=c.seed,
            export_at=frozenset(c.eval_at_updates),
            config_digest=config_digest(run_identity(c)),
            preemption_sync=not layout.cpu and layout.colocated,
        ),
        logger=c.logger,
        profile_steps=frozenset(c.profile_steps),
    )


def _pool_pages(plan: Plan) -> int | None:
    """The plan's page pool per replica (rollout.kv_cache=paged), None for a dense cache."""
    return plan.pool.pages if plan.pool else None


def sampler_dtype(config: Config) -> DType:
    """The rollout engines' weights: `rollout.param_dtype`, else the model's (Table I3)."""
    return config.rollout.param_dtype or config.model.param_dtype


def build_loop_plan(config: Config, *, staleness: int) -> LoopPlan:
    c = config
    return LoopPlan(
        steps=c.steps,
        staleness=staleness,
        eval_every_steps=c.eval_every_steps,
        eval_at_updates=tuple(c.eval_at_updates),
        eval_limit=c.dataset.eval_size,
        metrics_off_barrier=c.opt.metrics_off_barrier,
        freeze_gc=c.opt.freeze_gc,
        eval_target=c.eval_target,
        chips=c.resolved_hardware.chips,
        chip_hour_price_usd=c.hardware.chip_hour_price_usd,
        batches_per_pass=c.dataset.batches_per_pass,
        passes=c.dataset.passes,
    )


def build_settings(config: Config, *, local_devices: int) -> StepSettings:
    """One step's settings on a process with `local_devices` devices."""
    r, d = config.rollout, config.dataset
    chunk = config.trainer.logit_chunk_tokens
    return StepSettings(
        group_size=d.samples_per_prompt,
        max_new_tokens=d.max_new_tokens,
        row_tokens=trainer_row_tokens(d, config.trainer),
        loss_slot_multiple=math.lcm(
            min(chunk, d.samples_per_prompt * d.max_new_tokens), local_devices
        ),
        sampling=SamplingParams(
            temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, ignore_eos=r.ignore_eos
        ),
        eval_sampling=SamplingParams(temperature=r.eval_temperature, top_k=r.top_k, top_p=r.top_p),
        advantage=config.algo.advantage,
        advantage_eps=config.algo.advantage_eps,
        opt=config.opt,
        seed=config.seed,
        straggler=config.rollout.straggler,
    )


# Where a host of a cluster-started run listens and which host it is: they differ from machine
# to machine of one run (and may change when it resumes elsewhere), not what the run trains.
PER_HOST_KEYS = ("process_id", "bind_address")


def run_identity(config: Config) -> dict[str, Any]:
    """The resolved config that a resumed run must repeat: every host's the same (the host
    count resolved, as `Config.hosts` resolves `hardware.hosts: null`)."""
    resolved = config_as_dict(config)
    hardware = {k: v for k, v in resolved["hardware"].items() if k not in PER_HOST_KEYS}
    hardware["hosts"] = config.hosts
    return {**resolved, "hardware": hardware}


def config_as_dict(config: Config) -> dict[str, Any]:
    """The resolved config as plain JSON-able values (enums by value)."""

    def plain(value):
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return getattr(value, "value", value)

    return plain(config)
