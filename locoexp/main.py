"""`run(config)`: check the run, start its processes, build the runtime objects and execute it.

This is the only module that reads the root `Config`; it hands each builder its own sub-config.
Start-up order: everything that can refuse a run (memory fit, TP vs heads, task files,
vocabulary, schedule) is checked before anything is allocated or written. With `hardware=cpu`
and more than one host (or device per host) the run continues in spawned local processes
(`locoexp.placement.launch`); on a TPU slice every host runs this same function.
"""

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from locoexp.config import Config
from locoexp.dataset.admission import AdmissionLog
from locoexp.dataset.build import build_task
from locoexp.dataset.schedule import PromptSchedule
from locoexp.errors import ConfigError, require
from locoexp.hardware.config import ChipKind
from locoexp.metrics.breakdown import StepProfiler
from locoexp.metrics.cost import Checkpoint
from locoexp.metrics.run_output import RunOutput
from locoexp.model.checkpoint import load_model
from locoexp.model.memory import Roles, check_fit, describe_plan
from locoexp.placement.colocated import Colocated, LoopHooks, run_loop
from locoexp.placement.config import PlacementKind
from locoexp.placement.disaggregated import run_da
from locoexp.placement.launch import initialize_distributed, launch_local_processes
from locoexp.placement.multihost import HostGroup
from locoexp.placement.phases import StepSettings
from locoexp.rollout.build import build_engine
from locoexp.rollout.engine import SamplingParams
from locoexp.trainer.trainer import Trainer


def placement_roles(config: Config) -> Roles:
    hosts = config.hardware.hosts
    match config.placement.kind:
        case PlacementKind.co:
            return Roles(
                trainer_hosts=hosts,
                rollout_hosts=hosts,
                colocated=True,
                kl_reference=config.algo.kl_coef > 0,
            )
        case PlacementKind.single_controller:
            return Roles(
                trainer_hosts=hosts,
                rollout_hosts=hosts,
                colocated=True,
                hosts_per_engine=hosts,
                kl_reference=config.algo.kl_coef > 0,
            )
        case PlacementKind.da:
            trainer_hosts = round((config.split or 0) * hosts)
            return Roles(
                trainer_hosts=trainer_hosts,
                rollout_hosts=hosts - trainer_hosts,
                colocated=False,
                kl_reference=config.algo.kl_coef > 0,
            )


def process_layout(config: Config) -> tuple[int, int]:
    """(processes, devices per process) for this run: one process per host, except the single
    controller, which is one process holding every host's devices."""
    hw = config.hardware
    if config.placement.kind is PlacementKind.single_controller:
        return 1, hw.devices
    return hw.hosts, hw.devices_per_host


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
    check_run(config)
    if config.placement.kind is PlacementKind.da:  # a Ray driver starts the hosts as actors
        return run_da(
            config,
            run_dir=run_dir,
            resolved_config=resolved_config,
            sweep_name=sweep_name,
            progress=progress,
        )
    processes, devices = process_layout(config)
    args = (config, str(run_dir), resolved_config, sweep_name, progress)
    if config.hardware.chip is ChipKind.cpu and (processes > 1 or devices > 1):
        code = launch_local_processes(
            run_host, args, num_processes=processes, devices_per_process=devices
        )
        if code != 0:
            raise SystemExit(code)
        return json.loads((Path(run_dir) / "summary.json").read_text())
    if config.hardware.chip is not ChipKind.cpu and processes > 1:
        initialize_distributed(coordinator=None, num_processes=processes, process_id=None)
    return run_host(*args)


def plan(config: Config) -> str:
    """The dry-run report: hosts, devices per role, memory per device, parameters, verdict."""
    return describe_plan(
        config.model,
        config.hardware,
        config.rollout,
        config.dataset,
        config.trainer,
        placement_roles(config),
    )


def check_run(config: Config) -> None:
    """The refusals that need no data (memory fit, TP vs heads, placement), before any write."""
    check_fit(
        config.model,
        config.hardware,
        config.rollout,
        config.dataset,
        config.trainer,
        placement_roles(config),
    )


def run_host(
    config: Config,
    run_dir: str,
    resolved_config: dict[str, Any] | None,
    sweep_name: str | None,
    progress: bool,
) -> dict[str, Any]:
    """This process's part of the run; every host calls it, process 0 writes the run directory."""
    start_time = time.perf_counter()
    run_dir = Path(run_dir)
    hosts = HostGroup.current()
    task = build_checked_task(config)
    schedule = build_schedule(config, len(task.train))
    runner = build_runner(config, task, schedule, hosts)
    runner.admission_log = AdmissionLog(run_dir / "admission" / f"host{hosts.index}.jsonl")

    output = None
    if hosts.is_leader:
        output = RunOutput(
            run_dir,
            logger=config.logger,
            resolved_config=resolved_config or {},
            sweep_name=sweep_name,
            steps=config.steps,
            progress=progress,
        )

    def on_eval(record: dict) -> None:
        checkpoint = Checkpoint(
            step=record["step"], elapsed_s=record["time/elapsed_s"], score=record["eval/accuracy"]
        )
        output.on_eval(checkpoint, seconds=record["eval/seconds"])

    try:
        summary = run_loop(
            runner,
            profiler=StepProfiler(run_dir, frozenset(config.profile_steps), index=hosts.index),
            steps=config.steps,
            eval_every_steps=config.eval_every_steps,
            eval_at_updates=config.eval_at_updates,
            eval_limit=config.dataset.eval_size,
            hooks=LoopHooks(export=output.export if output else None, on_eval=on_eval),
            start_time=start_time,
        )
        if output is None:
            return summary
        return output.finish(
            summary,
            target=config.eval_target,
            chips=config.hardware.chips,
            chip_hour_price_usd=config.hardware.chip_hour_price_usd,
            wall_s=time.perf_counter() - start_time,
        )
    finally:
        if output is not None:
            output.close()


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


def build_runner(config: Config, task, schedule: PromptSchedule, hosts: HostGroup) -> Colocated:
    """The engine on this host's devices, the trainer on every device, the step settings."""
    model = load_model(config.model, seed=config.seed)
    engine_devices = (
        jax.local_devices()
        if hosts.count > 1 or config.placement.kind is PlacementKind.co
        else jax.devices()
    )
    engine = build_engine(
        model,
        config.rollout,
        eos_id=task.tokenizer.eos_id,
        pad_id=task.tokenizer.pad_id,
        devices=engine_devices,
        max_sequence_tokens=config.dataset.max_prompt_tokens + config.dataset.max_new_tokens,
    )
    trainer = Trainer(
        model,
        config.algo,
        config.trainer,
        mesh=Mesh(np.array(jax.devices()), ("fsdp",)),
        temperature=config.rollout.temperature,
        max_new_tokens=config.dataset.max_new_tokens,
    )
    return Colocated(
        task=task,
        schedule=schedule,
        engine=engine,
        trainer=trainer,
        settings=build_settings(config, local_devices=len(jax.local_devices())),
        hosts=hosts,
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
        row_tokens=config.trainer.row_tokens
        or _round_up(d.max_prompt_tokens + d.max_new_tokens, 8),
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


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def config_as_dict(config: Config) -> dict[str, Any]:
    """The resolved config as plain JSON-able values (enums by value)."""

    def plain(value):
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return getattr(value, "value", value)

    return plain(config)
