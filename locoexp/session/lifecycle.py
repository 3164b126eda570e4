"""`run_session(spec, files)`: one run's lifecycle, the same for every placement.

open or resume -> build the task and the transport -> restore -> drive the step loop -> stop,
checkpoint, export -> finish. The session owns the stop signals, the run's survival
(`checkpoint.session.RunSurvival`: resume rules, each checkpoint's `RunProgress`), the output
files (`metrics.run_output`), App. I.1's clock carried over a resume, and the finish; the
transport (`placement.transport.Transport`) carries the step and the training state, and nothing
else differs between placements:

- `co`, `single_controller`: every host process runs this session with an `InProcess` transport;
  the hosts agree on stops and on the resumed clock through their group; process 0 writes.
- `da`: the Ray driver runs it alone with `RayActors`; the trainer hosts write their own shards,
  the driver the weight version, the ledger and the batches in flight.

A stop signal ends the run after the running step and a checkpoint (`RunStopped`); a finished run
trains nothing; a restored run continues with its own records cut back to the checkpoint.
"""

import dataclasses
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import jax
import numpy as np

from locoexp.checkpoint.export import policy_directory
from locoexp.checkpoint.session import RunSurvival
from locoexp.checkpoint.state import latest_saved_step
from locoexp.checkpoint.stop import StopSignals, stop_agreed
from locoexp.dataset.schedule import PromptSchedule, build_schedule
from locoexp.dataset.task import Task
from locoexp.layout import TransportKind
from locoexp.metrics.cost import resumed_elapsed_s
from locoexp.metrics.run_output import RunFiles, RunOutput
from locoexp.metrics.timing import StepTimer
from locoexp.placement.build import build_checked_task, open_in_process
from locoexp.placement.loop import NOTHING_PUBLISHED, LoopClock, drive
from locoexp.placement.transport import Transport
from locoexp.session.spec import RunSpec


def run_session(spec: RunSpec, files: RunFiles) -> dict[str, Any]:
    """This process's part of the run (every host in-process, the driver under `da`); returns
    the run's summary (written to `summary.json` by the leader)."""
    start_time, timer = time.perf_counter(), StepTimer()
    run_dir = Path(files.run_dir)
    with StopSignals(run_dir) as signals:
        survival = open_survival(spec, run_dir)
        try:
            if survival.completed:
                return completed_summary(run_dir, steps=spec.loop.steps)
            task = build_checked_task(spec.halves.model, spec.halves.dataset)
            schedule = build_schedule(
                spec.halves.dataset, steps=spec.loop.steps, num_examples=len(task.train)
            )
            opener = OPEN_TRANSPORT[spec.layout.transport]
            with opener(spec, task, schedule, survival, timer) as transport:
                signals.install()  # again: a Ray driver's ray.init installed its own handler
                restored = survival.restored
                published = NOTHING_PUBLISHED
                if restored is not None:
                    published = transport.restore(survival.checkpoints, restored)
                hooks = SessionHooks(spec, transport, survival, signals, task)
                return drive_session(spec, files, hooks, timer, start_time, published)
        finally:
            survival.close()


def open_survival(spec: RunSpec, run_dir: Path) -> RunSurvival:
    s = spec.survival
    return RunSurvival.open(
        run_dir,
        mode=s.resume,
        every_steps=s.checkpoint_every_steps,
        steps=s.steps,
        seed=s.seed,
        digest=s.config_digest,
        export_at=s.export_at,
    )


Opener = Callable[
    [RunSpec, Task, PromptSchedule, RunSurvival, StepTimer], AbstractContextManager[Transport]
]


def open_in_process_transport(
    spec: RunSpec, task: Task, schedule: PromptSchedule, survival: RunSurvival, timer: StepTimer
) -> AbstractContextManager[Transport]:
    """Both halves in this host process; it writes its admission records and traces its own
    steps."""
    return open_in_process(
        spec.halves,
        task=task,
        schedule=schedule,
        timer=timer,
        run_dir=survival.run_dir,
        profile_steps=spec.profile_steps,
    )


def open_ray_transport(
    spec: RunSpec, task: Task, schedule: PromptSchedule, survival: RunSurvival, timer: StepTimer
) -> AbstractContextManager[Transport]:
    """The halves in Ray actors, this process their driver, every actor and Ray stopped when
    the run ends; the transport checks every batch against `schedule` (its ledger, carried
    over a resume) and times its waits itself."""
    from locoexp.placement.ray.transport import ray_actors  # noqa: PLC0415  (Ray: da only)

    assert spec.ray is not None, "a Ray transport's spec holds its Ray cluster"
    restored = survival.restored
    return ray_actors(
        spec.layout,
        spec.ray,
        spec.coordinator,
        spec.halves,
        schedule=schedule,
        example_ids=[e.id for e in task.train],
        run_dir=survival.run_dir,
        ledger_rows=restored.ledger if restored else (),
        freeze_gc=spec.loop.freeze_gc,
        profile_steps=spec.profile_steps,  # traced by the actors, each its own side
    )


# The transport a layout names (`Layout.transport`), opened for the run and stopped with it.
OPEN_TRANSPORT: dict[TransportKind, Opener] = {
    TransportKind.in_process: open_in_process_transport,
    TransportKind.ray: open_ray_transport,
}


def drive_session(spec, files, hooks, timer, start_time, published) -> dict[str, Any]:
    """The loop from the restored step, records cut back to it, App. I.1's clock carried on."""
    restored, group = hooks.survival.restored, hooks.transport.group
    steps, leader = spec.loop.steps, group.is_leader
    with files.open(spec.logger, steps=steps, leader=leader, survival=restored) as output:
        hooks.output = output
        offset = 0.0
        if restored is not None:  # the clock over the lost part, agreed from the leader's file
            local = resumed_elapsed_s(restored.elapsed_s, output.dropped) if output else 0.0
            offset = float(group.allgather(np.array([local]))[0, 0])
        hooks.resumed_at_s = offset
        plan = dataclasses.replace(spec.loop, start_step=hooks.survival.start_step)
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
            profiler=hooks.transport.profiler,
        )


class SessionHooks:
    """The loop's `SurvivalHooks`: stop agreement across the group, checkpoints every
    `checkpoint_every_steps` and at the end, the policy exported at `eval_at_updates` and the
    end, each through the transport."""

    def __init__(self, spec: RunSpec, transport: Transport, survival, signals, task: Task):
        self.spec, self.transport, self.survival = spec, transport, survival
        self.signals, self.tokenizer = signals, task.tokenizer
        self.output: RunOutput | None = None
        self.resumed_at_s = 0.0
        restored = survival.restored
        self.earlier_eval_s = restored.eval_total_s if restored else 0.0

    def stop_requested(self, step: int) -> int | None:
        self.survival.checkpoints.check()  # a failed background save ends the run at once
        group = self.transport.group
        return stop_agreed(
            self.signals,
            step=step,
            allgather=group.allgather if group.count > 1 else None,
            preemption_sync=self.spec.survival.preemption_sync,
        )

    def saves_after(self, updates: int) -> bool:
        return self.survival.saves_after(updates) or updates in self.survival.export_at

    def checkpoint(self, updates: int, clock: LoopClock, *, stopping: bool) -> None:
        steps = self.spec.loop.steps
        progress = self.survival.progress(
            updates=updates,
            elapsed_s=clock.elapsed_s(),
            eval_total_s=self.earlier_eval_s + clock.eval_total_s,
            scored=list(self.output.checkpoints) if self.output else [],
            resumed_at_s=self.resumed_at_s,
        )
        # the export first: one that cannot be written (a full disk) ends the run before this
        # step's checkpoint, so resuming trains from the one before and exports again
        if updates in self.survival.export_at or updates == steps:
            final = None if updates == steps else updates
            directory = policy_directory(self.survival.run_dir, updates=final)
            model = self.spec.halves.model
            self.transport.export(directory, model=model, tokenizer=self.tokenizer)
        wait = stopping or updates == steps
        self.transport.checkpoint(self.survival.checkpoints, progress, wait=wait)

    def last_checkpoint(self) -> str | None:
        step = latest_saved_step(self.survival.run_dir)  # from the files: da's trainers save them
        return None if step is None else str(self.survival.checkpoints.directory / str(step))


def completed_summary(run_dir: Path, *, steps: int) -> dict[str, Any]:
    """A run started again after it finished: nothing is trained; its summary is returned."""
    if jax.process_index() == 0:  # every host of a group runs this; the leader says so
        print(
            f"{run_dir} already holds all {steps} steps of this run (its final checkpoint); "
            "nothing to train: raise steps= to continue it, or use a new hydra.run.dir.",
            flush=True,
        )
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}
