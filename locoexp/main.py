"""`run(config)`: build the runtime objects of one run from the typed config and execute it.

This is the only module that reads the root `Config`; it hands each builder its own sub-config.
It owns the run directory's contents (metrics.jsonl, eval records, summary) and the order of
start-up: everything that can refuse a run (task files, vocabulary, schedule) is checked before
the first file is written.
"""

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from locoexp.config import Config
from locoexp.dataset.build import build_task
from locoexp.dataset.schedule import PromptSchedule
from locoexp.errors import ConfigError, require
from locoexp.metrics.cost import Checkpoint, compute_cost_to_learn
from locoexp.metrics.record import MetricsFile, Progress, format_summary
from locoexp.metrics.wandb_logger import build_logger
from locoexp.model.transformer import build_model
from locoexp.placement.colocated import Colocated, StepSettings, run_loop
from locoexp.rollout.engine import JaxEngine, SamplingParams
from locoexp.trainer.trainer import Trainer


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def build_schedule(config: Config, num_examples: int) -> PromptSchedule:
    d = config.dataset
    try:
        schedule = PromptSchedule(num_examples, d.prompts_per_step, seed=d.seed,
                                  batches_per_pass=d.batches_per_pass, passes=d.passes)
    except ValueError as error:
        raise ConfigError(f"dataset.batches_per_pass / dataset.prompts_per_step: {error}.") from None
    total = schedule.total_steps
    require(total is None or config.steps <= total,
            f"steps={config.steps} exceeds the {total} steps that dataset.batches_per_pass="
            f"{d.batches_per_pass} x dataset.passes={d.passes} define; set steps<={total}.")
    return schedule


def build_settings(config: Config) -> StepSettings:
    r, d = config.rollout, config.dataset
    return StepSettings(
        group_size=d.samples_per_prompt,
        max_new_tokens=d.max_new_tokens,
        row_tokens=config.trainer.row_tokens or _round_up(d.max_prompt_tokens + d.max_new_tokens, 8),
        sampling=SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                                ignore_eos=r.ignore_eos),
        eval_sampling=SamplingParams(temperature=r.eval_temperature, top_k=r.top_k, top_p=r.top_p),
        advantage=config.algo.advantage,
        advantage_eps=config.algo.advantage_eps,
        opt=config.opt,
        seed=config.seed,
    )


def run(config: Config, *, run_dir: str | Path = ".", resolved_config: dict[str, Any] | None = None,
        sweep_name: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Execute one run; returns its summary (also written to `<run_dir>/summary.json`)."""
    start_time = time.perf_counter()
    run_dir = Path(run_dir)
    # Everything that can refuse the run comes before the first write.
    task = build_task(config.dataset)
    require(task.tokenizer.vocab_size <= config.model.vocab_size,
            f"model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's "
            f"{task.tokenizer.vocab_size} tokens of dataset={config.dataset.kind.value}; pick a model "
            "whose vocabulary covers it.")
    schedule = build_schedule(config, len(task.train))
    settings = build_settings(config)

    model = build_model(config.model, seed=config.seed)
    devices = jax.local_devices()
    engine = JaxEngine(model, config.rollout, eos_id=task.tokenizer.eos_id,
                       pad_id=task.tokenizer.pad_id, devices=devices)
    trainer_mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    trainer = Trainer(model, config.algo, config.trainer, mesh=trainer_mesh,
                      temperature=config.rollout.temperature, max_new_tokens=config.dataset.max_new_tokens)
    del model  # the engine and the trainer hold the weights from here on
    runner = Colocated(task=task, schedule=schedule, engine=engine, trainer=trainer, settings=settings)

    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = MetricsFile(run_dir / "metrics.jsonl")
    logger = build_logger(config.logger, run_dir=run_dir, resolved_config=resolved_config or {},
                          run_name=run_dir.resolve().name, sweep_name=sweep_name)
    bar = Progress(config.steps, enabled=progress)
    checkpoints: list[Checkpoint] = []

    def export(record: dict) -> None:
        metrics_file.write(record)
        logger.log(record, step=record["step"])
        bar.update(record)

    def on_eval(record: dict) -> None:
        checkpoints.append(Checkpoint(step=record["step"], elapsed_s=record["time/elapsed_s"],
                                      score=record["eval/accuracy"]))
        metrics_file.write(record)
        logger.log(record, step=record["step"])

    try:
        summary = run_loop(runner, steps=config.steps, eval_every_steps=config.eval_every_steps,
                           eval_limit=config.dataset.eval_size, export=export, on_eval=on_eval,
                           start_time=start_time)
        cost = compute_cost_to_learn(checkpoints, target=config.eval_target, chips=config.hardware.chips,
                                     chip_hour_price_usd=config.hardware.chip_hour_price_usd)
        summary = {**summary, "eval_accuracy": checkpoints[-1].score, **cost.as_metrics(),
                   "wall_s": time.perf_counter() - start_time}
        logger.summary(summary)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    finally:
        bar.close()
        metrics_file.close()
        logger.finish()
    print(format_summary(summary), flush=True)
    return summary


def config_as_dict(config: Config) -> dict[str, Any]:
    """The resolved config as plain JSON-able values (enums by value)."""
    def plain(value):
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return getattr(value, "value", value)

    return plain(config)
