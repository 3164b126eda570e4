"""`run(config)`: check the run, start its processes, build every runtime object and drive it.

This is the only module that reads the root `Config`; it hands each builder its own sub-config
and builds, for every placement, what the one step loop (`locoexp.placement.loop`) runs: the two
halves of a step, their transport and the loop plan. Under `da` it builds the factories that the
Ray actors call to build their halves. Every placement survives the same way (`RunHooks`:
checkpoints, resume, a clean stop on SIGTERM/SIGINT, the policy exported); under `da` the driver
runs the hooks and the transport has the trainer hosts write their shards. Start-up order:
everything that can refuse a run (memory fit, TP vs heads, task files, vocabulary, schedule) is
checked before anything is allocated or written. With `hardware=cpu` and more than one host (or
device per host) the run continues in spawned local processes (`locoexp.placement.launch`); on
a TPU slice every host runs this same function.
"""

import dataclasses
import functools
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from locoexp.algo.config import AlgoConfig
from locoexp.checkpoint.export import policy_directory
from locoexp.checkpoint.session import RunSurvival
from locoexp.checkpoint.state import config_digest, latest_saved_step
from locoexp.checkpoint.stop import STOPPED_EXIT_CODES, RunStopped, StopSignals, stop_agreed
from locoexp.config import Config
from locoexp.dataset.admission import AdmissionLog
from locoexp.dataset.build import build_task
from locoexp.dataset.config import DatasetConfig
from locoexp.dataset.schedule import PromptSchedule
from locoexp.errors import ConfigError, require
from locoexp.hardware.config import ChipKind
from locoexp.metrics.breakdown import StepProfiler
from locoexp.metrics.cost import resumed_elapsed_s
from locoexp.metrics.run_output import RunFiles, RunOutput
from locoexp.metrics.timing import StepTimer
from locoexp.model.checkpoint import load_model
from locoexp.model.config import DType, ModelConfig
from locoexp.placement.config import PlacementKind
from locoexp.placement.halves import Published, RolloutHalf, TrainerHalf, publish_to_engine
from locoexp.placement.inprocess import InProcess
from locoexp.placement.launch import initialize_distributed, launch_local_processes
from locoexp.placement.layout import Layout, build_layout
from locoexp.placement.loop import LoopClock, LoopPlan, drive
from locoexp.placement.multihost import HostGroup
from locoexp.placement.phases import StepSettings
from locoexp.planner import Roles, Setup, check_fit, describe_plan, resolved_micro_batch_rows
from locoexp.planner.estimate import publication_bytes
from locoexp.planner.plan import object_store_bytes, trainer_row_tokens
from locoexp.rollout.build import build_engine
from locoexp.rollout.config import RolloutConfig
from locoexp.rollout.engine import SamplingParams
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.trainer import Trainer

if TYPE_CHECKING:  # Ray loads only in a `da` run (start-up of every other run is ~1 s shorter)
    from locoexp.placement.ray_hosts import DaLayout


def layout_of(config: Config) -> Layout:
    hw = config.hardware
    return build_layout(
        config.placement.kind,
        hosts=hw.hosts,
        devices_per_host=hw.devices_per_host,
        split=config.split,
    )


def placement_roles(config: Config) -> Roles:
    layout = layout_of(config)
    return Roles(
        trainer_hosts=layout.trainer_hosts,
        rollout_hosts=layout.rollout_hosts,
        colocated=layout.staleness == 0,  # co, single_controller: every host trains
        hosts_per_engine=layout.hosts_per_engine,
        kl_reference=config.algo.kl_coef > 0,
    )


def run(
    config: Config,
    *,
    run_dir: str | Path = ".",
    resolved_config: dict[str, Any] | None = None,
    sweep_name: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Execute one run; returns its summary (also written to `<run_dir>/summary.json`)."""
    if config.dry_run:
        print(plan(config), flush=True)
        return {"dry_run": True}
    config = check_run(config)
    files = RunFiles(str(run_dir), resolved_config, sweep_name, progress)
    if config.placement.kind is PlacementKind.da:  # a Ray driver starts the hosts as actors
        return run_driver(config, files)
    layout, hw = layout_of(config), config.hardware
    processes, devices = layout.processes, layout.devices_per_process
    if hw.chip is ChipKind.cpu and (processes > 1 or devices > 1):
        code = launch_local_processes(
            run_host,
            (config, files),
            num_processes=processes,
            devices_per_process=devices,
            coordinator_port=hw.coordinator_port,
            bind_address=hw.listen_address(multi_machine=False),
        )
        if code in STOPPED_EXIT_CODES:  # every host checkpointed after a stop signal
            raise RunStopped(latest_saved_step(run_dir) or 0, code - 128)
        if code != 0:
            raise SystemExit(code)
        return json.loads((Path(run_dir) / "summary.json").read_text())
    if hw.chip is not ChipKind.cpu and processes > 1:
        initialize_distributed(
            coordinator=None,
            num_processes=processes,
            process_id=None,
            bind_address=hw.listen_address(multi_machine=True),
        )
    return run_host(config, files)


def plan_setup(config: Config) -> Setup:
    """What the memory plan reads: the sub-configs and the placement's roles."""
    c = config
    return Setup(
        model=c.model,
        hardware=c.hardware,
        rollout=c.rollout,
        dataset=c.dataset,
        trainer=c.trainer,
        roles=placement_roles(c),
    )


def plan(config: Config) -> str:
    """The dry-run report: hosts, devices per role, memory per device, parameters, verdict."""
    note = ""
    if config.hardware.hosts_auto:
        split = f" split={config.split}" if config.split is not None else ""
        note = (
            f"hardware.hosts={config.hardware.hosts} chosen: the smallest count "
            f"placement={config.placement.kind.value}{split} needs"
        )
    return describe_plan(plan_setup(config), hosts_note=note)


def check_run(config: Config) -> Config:
    """The refusals that need no data (memory fit, TP vs heads, placement), before any write;
    returns `config` with trainer.micro_batch_rows and rollout.capacity resolved by the plan."""
    resolved = check_fit(plan_setup(config))
    return dataclasses.replace(
        config,
        trainer=dataclasses.replace(
            config.trainer, micro_batch_rows=resolved_micro_batch_rows(config.trainer, resolved)
        ),
        rollout=dataclasses.replace(config.rollout, capacity=resolved.capacity),
    )


def run_host(config: Config, files: RunFiles) -> dict[str, Any]:
    """`co` and `single_controller`: this process's part of the run (every host calls it; the
    leader writes the run directory). A run directory with a checkpoint resumes from it
    (`resume`); a stop signal ends the run after a checkpoint of the last finished step
    (`RunStopped`); a run whose final checkpoint exists trains nothing."""
    start_time = time.perf_counter()
    hosts, timer = HostGroup.current(), StepTimer()
    with StopSignals() as signals:
        survival = open_survival(config, Path(files.run_dir))
        try:
            if survival.completed:
                return completed_summary(
                    survival.run_dir, steps=config.steps, leader=hosts.is_leader
                )
            task = build_checked_task(config)
            transport = build_in_process(
                config, task, build_schedule(config, len(task.train)), hosts, timer
            )
            run_dir = Path(files.run_dir)
            transport.rollout.admission_log = AdmissionLog(
                run_dir / "admission" / f"host{hosts.index}.jsonl"
            )
            published = Published(0)
            if survival.restored is not None:
                state = survival.restore(transport.state())
                published = transport.load_state(state, steps_done=survival.start_step)
            hooks = RunHooks(config, transport, survival, signals, hosts, task.tokenizer)
            return drive_surviving(config, files, hooks, timer, start_time, published)
        finally:
            survival.close()


def drive_surviving(config, files, hooks, timer, start_time, published) -> dict[str, Any]:
    """The loop from the restored step, records cut back to it, App. I.1's clock carried on."""
    restored, hosts = hooks.survival.restored, hooks.hosts
    leader = hosts.is_leader
    with files.open(config.logger, steps=config.steps, leader=leader, survival=restored) as output:
        hooks.output = output
        offset = 0.0
        if restored is not None:  # the clock over the lost part, agreed from the leader's file
            local = resumed_elapsed_s(restored.elapsed_s, output.dropped) if output else 0.0
            offset = float(hosts.allgather(np.array([local]))[0, 0])
        hooks.resumed_at_s = offset
        plan = dataclasses.replace(build_loop_plan(config), start_step=hooks.survival.start_step)
        return drive(
            hooks.transport,
            plan,
            timer=timer,
            output=output,
            start_time=start_time,
            clock_offset_s=offset,
            hooks=hooks,
            # a resumed run's summary says over how many attempts (a fresh run's keys unchanged)
            extra_summary={"resume/attempts": 1 + restored.attempts} if restored else None,
            earlier_eval_s=hooks.earlier_eval_s,
            published=published,
            profiler=StepProfiler(
                Path(files.run_dir), frozenset(config.profile_steps), index=hosts.index
            ),
        )


class RunHooks:
    """The loop's `SurvivalHooks`: stop agreement across hosts, checkpoints every
    `checkpoint_every_steps` and at the end, the policy exported at `eval_at_updates` and the
    end. Under `co` and `single_controller` every host calls them (process 0 writes); under `da`
    the driver does, and its transport has the trainer hosts write their shards."""

    def __init__(self, config, transport, survival, signals, hosts, tokenizer):
        self.config, self.transport, self.survival = config, transport, survival
        self.signals, self.hosts, self.tokenizer = signals, hosts, tokenizer
        self.output: RunOutput | None = None
        self.resumed_at_s = 0.0
        restored = survival.restored
        self.earlier_eval_s = restored.eval_total_s if restored else 0.0

    def stop_requested(self, step: int) -> int | None:
        # JAX's preemption notice reaches the processes of a jax.distributed group; the da driver
        # is in none (its trainer hosts' group is theirs), so only its own signals count there
        c = self.config
        return stop_agreed(
            self.signals,
            step=step,
            allgather=self.hosts.allgather if self.hosts.count > 1 else None,
            preemption_sync=c.hardware.chip is not ChipKind.cpu
            and c.placement.kind is not PlacementKind.da,
        )

    def saves_after(self, updates: int) -> bool:
        return self.survival.saves_after(updates) or updates in self.survival.export_at

    def checkpoint(self, updates: int, clock: LoopClock, *, stopping: bool) -> None:
        steps = self.config.steps
        progress = self.survival.progress(
            updates=updates,
            elapsed_s=clock.elapsed_s(),
            eval_total_s=self.earlier_eval_s + clock.eval_total_s,
            scored=list(self.output.checkpoints) if self.output else [],
            resumed_at_s=self.resumed_at_s,
        )
        wait = stopping or updates == steps
        self.transport.checkpoint(self.survival.checkpoints, progress, wait=wait)
        if updates in self.survival.export_at or updates == steps:
            final = None if updates == steps else updates
            directory = policy_directory(self.survival.run_dir, updates=final)
            self.transport.export(directory, model=self.config.model, tokenizer=self.tokenizer)

    def last_checkpoint(self) -> str | None:
        step = latest_saved_step(self.survival.run_dir)  # from the files: da's trainers save them
        return None if step is None else str(self.survival.checkpoints.directory / str(step))


def open_survival(config: Config, run_dir: Path) -> RunSurvival:
    return RunSurvival.open(
        run_dir,
        mode=config.resume,
        every_steps=config.checkpoint_every_steps,
        steps=config.steps,
        seed=config.seed,
        digest=config_digest(config_as_dict(config)),
        export_at=frozenset(config.eval_at_updates),
    )


def completed_summary(run_dir: Path, *, steps: int, leader: bool) -> dict[str, Any]:
    """A run started again after it finished: nothing is trained; its summary is returned."""
    if leader:
        print(
            f"{run_dir} already holds all {steps} steps of this run (its final checkpoint); "
            "nothing to train: raise steps= to continue it, or use a new hydra.run.dir.",
            flush=True,
        )
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def config_as_dict(config: Config) -> dict[str, Any]:
    """The resolved config as plain JSON-able values (enums by value)."""

    def plain(value):
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return getattr(value, "value", value)

    return plain(config)


def run_driver(config: Config, files: RunFiles) -> dict[str, Any]:
    """`da`: the Ray driver; the halves run in actors built by `da_factories`. It survives like
    `run_host` (`RunHooks`): checkpoints and resume (the trainer hosts write and read their
    shards, the driver the weight version, the ledger and the next batch), a stop signal ends
    the run after a checkpoint, a finished run trains nothing; a lost rollout host is restarted
    (`RayActors`), a lost trainer host ends the run with one sentence (`RunFailed`)."""
    from locoexp.placement.ray_transport import BatchLedger, ray_actors  # noqa: PLC0415

    start_time = time.perf_counter()
    task = build_checked_task(config)
    schedule = build_schedule(config, len(task.train))
    run_dir = Path(files.run_dir)
    survival = open_survival(config, run_dir)
    try:
        if survival.completed:
            return completed_summary(run_dir, steps=config.steps, leader=True)
        restored = survival.restored
        ledger = BatchLedger(
            schedule,
            [e.id for e in task.train],
            run_dir / "batches.jsonl",
            rows=restored.ledger if restored else (),
        )
        actors = ray_actors(
            da_layout(config),
            **da_factories(config, schedule),
            freeze_gc=config.opt.freeze_gc,
            ledger=ledger,
            run_dir=run_dir,
        )
        # signals after ray.init, which installs a SIGTERM handler of its own
        with actors as transport, StopSignals() as signals:
            published = transport.restore(restored) if restored else Published(0)
            driver = HostGroup(index=0, count=1)  # the one process that records and decides
            hooks = RunHooks(config, transport, survival, signals, driver, task.tokenizer)
            return drive_surviving(config, files, hooks, StepTimer(), start_time, published)
    finally:
        survival.close()


def sampler_dtype(config: Config) -> DType:
    """The rollout engines' weights: `rollout.param_dtype`, else the model's (Table I3)."""
    return config.rollout.param_dtype or config.model.param_dtype


def da_layout(config: Config) -> "DaLayout":
    from locoexp.placement.ray_hosts import DaLayout  # noqa: PLC0415

    layout, hw = layout_of(config), config.hardware
    return DaLayout(
        trainer_hosts=layout.trainer_hosts,
        rollout_hosts=layout.rollout_hosts,
        devices_per_host=hw.devices_per_host,
        cpu_devices=hw.chip is ChipKind.cpu,
        ray_address=config.placement.ray_address,
        coordinator_port=hw.coordinator_port,
        bind_address=hw.listen_address(multi_machine=config.placement.ray_address is not None),
        rollout_restarts=config.placement.rollout_restarts,
        object_store_bytes=object_store_bytes(
            publication_bytes(config.model, sampler_dtype(config))
        ),
    )


def da_factories(config: Config, schedule: PromptSchedule) -> dict[str, Any]:
    """What the Ray actors call to build their halves (shipped to them by Ray)."""
    settings = build_settings(config, local_devices=config.hardware.devices_per_host)
    build_rollout = functools.partial(
        build_actor_rollout_half,
        model=config.model,
        rollout=config.rollout,
        dataset=config.dataset,
        schedule=schedule,
        settings=settings,
    )
    build_trainer = functools.partial(
        build_actor_trainer_half,
        model=config.model,
        algo=config.algo,
        trainer=config.trainer,
        sampler_dtype=sampler_dtype(config),
        settings=settings,
    )
    return dict(build_rollout=build_rollout, build_trainer=build_trainer)


def build_loop_plan(config: Config) -> LoopPlan:
    return LoopPlan(
        steps=config.steps,
        staleness=layout_of(config).staleness,
        eval_every_steps=config.eval_every_steps,
        eval_at_updates=tuple(config.eval_at_updates),
        eval_limit=config.dataset.eval_size,
        metrics_off_barrier=config.opt.metrics_off_barrier,
        freeze_gc=config.opt.freeze_gc,
        eval_target=config.eval_target,
        chips=config.hardware.chips,
        chip_hour_price_usd=config.hardware.chip_hour_price_usd,
    )


def build_checked_task(config: Config):
    """The run's task, refused when the model's vocabulary does not cover its tokenizer."""
    task = build_task(config.dataset, tokenizer_dir=config.model.checkpoint)
    require(
        task.tokenizer.vocab_size <= config.model.vocab_size,
        f"model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's "
        f"{task.tokenizer.vocab_size} tokens of dataset={config.dataset.kind.value}; pick a model "
        "whose vocabulary covers it (e.g. model=tiny_qwen).",
    )
    return task


def build_in_process(
    config: Config, task, schedule: PromptSchedule, hosts: HostGroup, timer: StepTimer
) -> InProcess:
    """`co` and `single_controller`: one policy for the engine on this process's devices (every
    device of the single controller) and the trainer on every device; one shared `timer`."""
    policy = load_model(config.model, seed=config.seed)
    settings = build_settings(config, local_devices=len(jax.local_devices()))
    where = dict(settings=settings, timer=timer)
    rollout = build_rollout_half(
        policy,
        task,
        config.rollout,
        config.dataset,
        schedule=schedule,
        host=hosts.index,
        hosts=hosts.count,
        **where,
    )
    publish = functools.partial(
        publish_to_engine, engine=rollout.engine, one_call=config.opt.publish_in_one_call
    )
    releases = config.rollout.release_weights_during_training  # Table H2's 405B workaround
    release = rollout.engine.release_weights if releases else None
    trainer = build_trainer_half(
        policy, config.algo, config.trainer, group=hosts, publish=publish, release=release, **where
    )
    return InProcess(rollout=rollout, trainer=trainer, hosts=hosts)


def build_rollout_half(
    policy, task, rollout: RolloutConfig, dataset: DatasetConfig, *, load=None, **half
) -> RolloutHalf:
    """A host's rollout half: its engine over this process's devices, from `policy`'s weights."""
    engine = build_engine(
        policy,
        rollout,
        eos_id=task.tokenizer.eos_id,
        pad_id=task.tokenizer.pad_id,
        devices=jax.local_devices(),
        max_sequence_tokens=dataset.max_prompt_tokens + dataset.max_new_tokens,
    )
    return RolloutHalf(task=task, engine=engine, load=load, **half)


def build_trainer_half(policy, algo: AlgoConfig, trainer: TrainerConfig, **half) -> TrainerHalf:
    """The trainer half over every device of this process's `jax.distributed` group."""
    s, mesh = half["settings"], Mesh(np.array(jax.devices()), ("fsdp",))
    temperature, max_new = s.sampling.temperature, s.max_new_tokens
    policy_trainer = Trainer(
        policy, algo, trainer, mesh=mesh, temperature=temperature, max_new_tokens=max_new
    )
    return TrainerHalf(trainer=policy_trainer, **half)


def build_actor_rollout_half(
    *, model: ModelConfig, rollout: RolloutConfig, dataset: DatasetConfig, **half
) -> RolloutHalf:
    """Called in a `da` rollout actor: its own task, policy, engine and object-store loader."""
    from locoexp.placement.ray_hosts import load_from_object_store  # noqa: PLC0415

    policy = load_model(model, seed=half["settings"].seed)
    # what published pure dicts are loaded into: shapes only, so the initial weights live once
    template = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), nnx.split(policy, nnx.Param)[1]
    )
    one_call = half["settings"].opt.publish_in_one_call
    load = functools.partial(load_from_object_store, template=template, one_call=one_call)
    task = build_task(dataset, tokenizer_dir=model.checkpoint)
    return build_rollout_half(policy, task, rollout, dataset, load=load, **half)


def build_actor_trainer_half(
    *,
    model: ModelConfig,
    algo: AlgoConfig,
    trainer: TrainerConfig,
    sampler_dtype: DType,
    group: HostGroup,
    **half,
) -> TrainerHalf:
    """Called in a `da` trainer actor once it joined the trainer group: its share of every
    batch, publishing through the object store in the rollout engines' dtype."""
    from locoexp.placement.ray_hosts import publish_to_object_store  # noqa: PLC0415

    one_call = half["settings"].opt.publish_in_one_call
    return build_trainer_half(
        load_model(model, seed=half["settings"].seed),
        algo,
        trainer,
        group=group,
        publish=functools.partial(
            publish_to_object_store, one_call=one_call, dtype=jnp.dtype(sampler_dtype.value)
        ),
        share=(group.index, group.count),
        **half,
    )


def build_schedule(config: Config, num_examples: int) -> PromptSchedule:
    d = config.dataset
    try:
        schedule = PromptSchedule(
            num_examples,
            d.prompts_per_step,
            seed=d.seed,
            batches_per_pass=d.batches_per_pass,
            passes=d.passes,
        )
    except ValueError as error:
        raise ConfigError(
            f"dataset.batches_per_pass / dataset.prompts_per_step: {error}."
        ) from None
    total = schedule.total_steps
    require(
        total is None or config.steps <= total,
        f"steps={config.steps} exceeds the {total} steps that dataset.batches_per_pass="
        f"{d.batches_per_pass} x dataset.passes={d.passes} define; set steps<={total}.",
    )
    return schedule


def build_settings(config: Config, *, local_devices: int) -> StepSettings:
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
    )
