"""`compile_run(config)`: what fits, from XLA's compiled programs rather than the plan's model.

The run's programs (`programs.py`) are compiled for its devices (`topology.py`: a TPU slice's,
on any machine with libtpu) at the plan's resolved sizes. The layers of a decoder are unrolled
copies of one block, so XLA's buffer sizes grow linearly with the layer count: each program is
compiled at two cuts of the model (`layer_cuts`: 2 and 4 layers, or 2 and 4 periods of a
Gemma4 local/global pattern; the whole model when it is that small) and each size is read at
the model's own layer count from the line through the two. On Qwen3-0.6B's GSM8K train step
(v7x, 8 devices, splash attention), the line through 2 and 4 layers gives the 28-layer
compile's temporaries within 3.0% and its arguments within 0.01% (experiments/LOG.md,
session 20); compiling all 28 layers takes 226 s on 2 cores against 138 s for the two cuts.
Near the device's memory the line does not hold: XLA-TPU rematerialises on its own to fit, and a
refusal names what it needs where it gave up. Where a cut is refused (`cuts_on_a_line`) or the
line reads a program past the device's memory, the whole model is compiled and decides.
A trainer whose blocks are one scan (`programs.trainer_scans`: rematerialised, one block
structure) is always compiled whole: its compile is one block's whatever the depth (the GSM8K
step above, scanned: 121 s at 2 layers, 131 s at 28, whose temporaries the line through 2 and
4 layers gave within 0.2%; experiments/LOG.md, session 24); the engine still uses the cuts.

A role's peak per device is its largest program's footprint plus what stays alive beside it:
colocated (co, single_controller), the train step also holds the engine's weights and the
engine's programs the trainer's state; publication and the LoRA merge hold the trainer state
their arguments leave out. The verdict compares each role's peak with
`hardware.memory_per_device_gib`. Nothing is allocated and nothing runs.
"""

import dataclasses

from locoexp.compiled.programs import (
    ProgramMemory,
    RunShapes,
    compile_programs,
    resident_bytes,
    trainer_scans,
)
from locoexp.compiled.topology import topology_devices
from locoexp.config import Config
from locoexp.errors import ConfigError
from locoexp.model.config import ModelConfig
from locoexp.planner import check_tensor_parallel, resolve_plan, resolved_micro_batch_rows
from locoexp.planner.fit import check_expert_parallel
from locoexp.planner.plan import Plan, capacity_bytes, machine_total, shared_memory
from locoexp.session.build import build_settings, plan_setup

_SIZES = ("argument", "output", "alias", "temp", "peak", "flops", "bytes_accessed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompiledRun:
    """A run's programs as XLA compiled them, at the model's full depth, and the verdict."""

    programs: list[ProgramMemory]
    layer_cuts: dict[str, tuple[int, ...]]  # per role, the layer counts compiled
    trainer_state: int  # bytes per device alive between programs
    engine_weights: int
    colocated: bool
    keeps_engine_weights: bool  # colocated and not rollout.release_weights_during_training
    limit: int  # bytes per device, or (shared) the machine's usable bytes
    plan: Plan
    # hardware=cpu: every local process's devices at their role's XLA peak, the processes'
    # runtime and Ray's object store, summed (`planner.plan.machine_total`); 0 on a slice
    machine_total: int = 0
    target: str  # libtpu's topology name, or the backend's

    def peak(self, program: ProgramMemory) -> float:
        """The program's footprint plus the state alive beside it on the same device."""
        beside = 0.0
        if program.role == "trainer":
            if program.name != "train_step":  # its arguments leave out part of the state
                beside += max(self.trainer_state - program.argument, 0)
            beside += self.engine_weights if self.keeps_engine_weights else 0
        elif self.colocated:
            beside += self.trainer_state
        return program.footprint + beside

    @property
    def refusals(self) -> list[ProgramMemory]:
        """Programs XLA refused to compile for running out of the device's memory."""
        return [p for p in self.programs if p.refusal is not None]

    @property
    def engine_compiled(self) -> bool:
        return any(p.role == "engine" for p in self.programs)

    def role_peak(self, role: str) -> float:
        """The role's largest peak; an engine whose programs are not locoexp's (`rollout=vllm`)
        peaks at the plan's figure."""
        if role == "engine" and not self.engine_compiled:
            return float(self.plan.engine_peak)
        return max((self.peak(p) for p in self.programs if p.role == role), default=0.0)

    @property
    def shared(self) -> bool:
        """hardware=cpu: the local processes share the machine's memory."""
        return self.machine_total > 0

    @property
    def fits(self) -> bool:
        if self.shared:
            return self.machine_total <= self.limit and not self.refusals
        roles_fit = all(self.role_peak(r) <= self.limit for r in ("trainer", "engine"))
        return roles_fit and not self.refusals

    @property
    def compile_seconds(self) -> float:
        return sum(p.seconds for p in self.programs)


def layer_cuts(model: ModelConfig) -> tuple[int, ...]:
    """The layer counts to compile: two cuts whose sizes extrapolate linearly, or the whole
    model when it is no deeper than the second cut."""
    period = model.global_attention_every if model.gemma4 else 1
    cuts = (2 * period, 4 * period)
    return (model.num_layers,) if model.num_layers <= cuts[1] else cuts


def cuts_on_a_line(cut: list[ProgramMemory], wider: list[ProgramMemory]) -> bool:
    """Whether XLA laid out every program at both cuts. A refusal's figure is not on the line
    through the cuts: SWE's trainer on 16 devices read 173.5 GiB on the line through two
    refused cuts; compiled at its 28 layers XLA refuses it needing 120.5. Two laid-out cuts
    can be off it too near the memory: on 32 devices (App. F's 4/4 split) the line read 348.5
    and the whole model is refused at 104.9 (experiments/LOG.md, session 22)."""
    return all(p.refusal is None and q.refusal is None for p, q in zip(cut, wider, strict=True))


def at_depth(cut: list[ProgramMemory], wider: list[ProgramMemory], cuts, layers: int):
    """Each program's sizes read at `layers` from the line through its two compiled cuts
    (compile seconds: both compiles together)."""
    (a, b), out = cuts, []
    for p, q in zip(cut, wider, strict=True):
        scaled = {
            k: max(getattr(p, k) + (getattr(q, k) - getattr(p, k)) * (layers - a) / (b - a), 0.0)
            for k in _SIZES
        }
        if not (p.peak and q.peak):  # XLA-TPU's peak on one cut only: neither is read
            scaled["peak"] = 0.0
        # a cut XLA refused: the deeper model needs more (its temporaries are a lower bound)
        refusal = q.refusal or p.refusal
        seconds = p.seconds + q.seconds
        out.append(dataclasses.replace(p, **scaled, seconds=seconds, refusal=refusal))
    return out


def run_shapes(config: Config) -> RunShapes:
    """The run's sub-configs at the plan's resolved micro-batches and capacity."""
    setup = plan_setup(config)
    check_tensor_parallel(setup)
    check_expert_parallel(setup)
    plan = resolve_plan(setup)
    settings = build_settings(config, local_devices=config.hardware.devices_per_host)
    micro = resolved_micro_batch_rows(config.trainer, plan)
    return RunShapes(
        model=config.model,
        algo=config.algo,
        trainer=dataclasses.replace(config.trainer, micro_batch_rows=micro),
        rollout=config.rollout.at_capacity(
            plan.capacity, pool_pages=plan.pool.pages if plan.pool else None
        ),
        adapter=config.adapter,
        sampling=settings.sampling,
        max_new_tokens=config.dataset.max_new_tokens,
        layout=setup.layout,
        devices_per_host=config.hardware.devices_per_host,
        plan=plan,
    )


def compile_run(config: Config, devices: list | None = None) -> CompiledRun:
    """Compile every program of `config`'s roles for `devices` (default: its TPU slice's
    topology) and judge the fit from XLA's memory analysis."""
    from locoexp.compiled.topology import topology_name  # noqa: PLC0415

    shapes = run_shapes(config)
    target = devices[0].platform if devices else topology_name(config.hardware)
    devices = devices or topology_devices(config.hardware)
    limit = capacity_bytes(config.hardware)
    if trainer_scans(shapes):  # its compile does not grow with the depth: the whole model
        full = (shapes.model.num_layers,)
        trainer = compile_programs(shapes, devices, layers=full[0], roles=("trainer",))
        engine, engine_cuts = _at_depth(shapes, devices, ("engine",), limit)
        programs, cuts = trainer + engine, {"trainer": full, "engine": engine_cuts}
    else:
        programs, both = _at_depth(shapes, devices, ("trainer", "engine"), limit)
        cuts = {"trainer": both, "engine": both}
    trainer_state, engine_weights = resident_bytes(shapes, devices)
    r = shapes.layout
    run = CompiledRun(
        programs=programs,
        layer_cuts=cuts,
        trainer_state=trainer_state,
        engine_weights=engine_weights,
        colocated=r.colocated,
        keeps_engine_weights=r.colocated and not config.rollout.release_weights_during_training,
        limit=limit,
        plan=shapes.plan,
        target=target,
    )
    if not shared_memory(config.hardware):
        return run
    peaks = (int(run.role_peak("trainer")), int(run.role_peak("engine")))
    total = machine_total(plan_setup(config), *peaks, shapes.plan.publication)
    return dataclasses.replace(run, machine_total=total)


def _at_depth(shapes: RunShapes, devices: list, roles: tuple[str, ...], limit: int):
    """The programs of `roles` at the model's depth, and the layer counts compiled: on the line
    through two cuts, or the whole model where a cut is refused or the line reads a program
    past the device's memory."""
    cuts = layer_cuts(shapes.model)
    compiled = [compile_programs(shapes, devices, layers=n, roles=roles) for n in cuts]
    if len(cuts) > 1 and not cuts_on_a_line(*compiled):  # a refusal: the whole model, once
        cuts = (shapes.model.num_layers,)
        compiled = [compile_programs(shapes, devices, layers=cuts[0], roles=roles)]
    programs = (
        compiled[0]
        if len(cuts) == 1
        else at_depth(compiled[0], compiled[1], cuts, shapes.model.num_layers)
    )
    if len(cuts) > 1 and any(p.footprint > limit for p in programs):  # near the memory: whole
        cuts = (shapes.model.num_layers,)
        programs = compile_programs(shapes, devices, layers=cuts[0], roles=roles)
    return programs, cuts


def _overrides(label: str) -> list[str]:
    """A plan proposal's overrides ("trainer.micro_batch_rows=4 (or 0, the most that fit)")."""
    return label.split(" (", 1)[0].split()


def confirm_proposals(job: list[str], result: CompiledRun, *, tries: int = 2, compile_job=None):
    """The plan's proposals for the role XLA found too large, compiled in turn (at most
    `tries`, by `compile_job`, default `compile_run`): (the first that XLA fits and its
    result, or None; the proposals tried)."""
    from locoexp.compose import compose_config  # noqa: PLC0415
    from locoexp.planner.fit import remedies  # noqa: PLC0415

    config = compose_config(job)
    roles = [p.role for p in result.refusals] or [max(("trainer", "engine"), key=result.role_peak)]
    if result.shared and not result.refusals:  # the local processes together
        roles = ["machine"]
    proposals = remedies(plan_setup(config), roles[0])[:tries]
    for label in proposals:
        try:
            tried = (compile_job or compile_run)(compose_config([*job, *_overrides(label)]))
        except ConfigError:
            continue
        if tried.fits:
            return (label, tried), proposals
    return None, proposals
