"""The `dry_run=compile` report: XLA's bytes per program and role beside the plan's, the verdict.

It formats; for a run that does not fit it names the plan's proposals, and which of them XLA
fits where they were compiled (`verdict.confirm_proposals`). It never compiles.
"""

import jax.numpy as jnp

from locoexp.compiled.verdict import CompiledRun
from locoexp.model.paged_kernel import kernel_note
from locoexp.planner.estimate import GIB
from locoexp.planner.fit import remedies
from locoexp.planner.plan import Setup
from locoexp.rollout.config import KVCacheKind

_HEADER = (
    f"{'role':<8} {'program':<11} {'argument':>9} {'output':>8} {'alias':>7} {'temp':>7} "
    f"{'peak':>7} {'plan':>7} {'compile s':>9}"
)


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f}"


def _plan_peak(result: CompiledRun, role: str) -> float:
    return result.plan.trainer_peak if role == "trainer" else result.plan.engine_peak


def _rows(result: CompiledRun) -> list[str]:
    rows = [_HEADER]
    for p in result.programs:
        if p.refusal is not None:
            rows.append(f"{p.role:<8} {p.name:<11} refused by XLA (out of memory): {p.refusal}")
            continue
        rows.append(
            f"{p.role:<8} {p.name:<11} {_gib(p.argument):>9} {_gib(p.output):>8} "
            f"{_gib(p.alias):>7} {_gib(p.temp):>7} {_gib(result.peak(p)):>7} "
            f"{_gib(_plan_peak(result, p.role)):>7} {p.seconds:>9.1f}"
        )
    return rows


def _depth(result: CompiledRun, layers: int) -> str:
    """How each role's sizes were read at the model's depth."""

    def said(cuts: tuple[int, ...]) -> str:
        if len(cuts) == 1:
            return f"all {layers} layers compiled"
        return f"compiled at {cuts[0]} and {cuts[1]} layers, sizes read at {layers} on their line"

    trainer, engine = result.layer_cuts["trainer"], result.layer_cuts["engine"]
    if trainer == engine or not result.engine_compiled:
        return said(trainer)
    return f"trainer: {said(trainer)} (its blocks are one scan); engine: {said(engine)}"


def verdict_line(result: CompiledRun, setup: Setup, confirmed=None) -> str:
    """Each role's peak per device (XLA, and the plan's), or on a shared CPU machine all local
    processes together, and the verdict from XLA; with `confirmed`
    (`verdict.confirm_proposals`), which of the plan's proposals XLA fits."""
    limit, roles = result.limit, ("trainer", "engine")
    parts = [
        f"{role} {_gib(result.role_peak(role))} GiB (plan {_gib(_plan_peak(result, role))})"
        for role in roles
    ]
    if not result.engine_compiled:  # rollout=vllm: vLLM's programs, not compiled here
        parts[1] = (
            f"engine (rollout=vllm: the plan's, not compiled) {_gib(result.plan.engine_peak)}"
        )
    head = f"per device, XLA: {', '.join(parts)} of {_gib(limit)}"
    if result.shared:
        processes = setup.layout.local_processes
        head = (
            f"{head}; this machine, XLA: {_gib(result.machine_total)} GiB for all {processes} "
            f"local processes together (plan {_gib(result.plan.machine_total)})"
        )
    if result.fits:
        return f"{head}: fits (XLA)"
    role = max(roles, key=result.role_peak)
    need = result.role_peak(role)
    refused, note = result.refusals, ""
    if refused:  # XLA's own words: the program cannot be laid out in the device's memory
        role, first = refused[0].role, refused[0]
        need = result.peak(first)
        note = f" (XLA refused {first.role} {first.name}: {str(first.refusal).rstrip('.')})"
    shortfall = f"the {role} needs {_gib(need)} GiB per device"
    if result.shared and not refused:
        role, need = "machine", result.machine_total
        shortfall = f"the local processes need {_gib(need)} GiB together"
        where = "the machine's usable"
    else:
        where = "the device's"
    return (
        f"{head}: does not fit (XLA): {shortfall}, {_gib(need - limit)} more than {where} "
        f"{_gib(limit)}{note}{_advice(setup, role, roles, confirmed)}"
    )


def _advice(setup: Setup, role: str, roles, confirmed) -> str:
    fixes = remedies(setup, role)
    advice = (
        f"; the plan proposes {' or '.join(fixes)} (compile it to confirm)"
        if fixes
        else "; no single setting the plan knows makes it fit: lower dataset.max_new_tokens "
        "or dataset.prompts_per_step, or use a larger slice"
    )
    if confirmed is not None:
        (fit, tried) = confirmed
        if fit is not None:
            label, other = fit
            peaks = ", ".join(f"{r} {_gib(other.role_peak(r))}" for r in roles)
            if other.shared:
                peaks = f"{_gib(other.machine_total)} GiB together"
            else:
                peaks += " GiB per device"
            advice = f"; it fits with {label} (compiled: {peaks}, fits (XLA))"
        elif tried:
            advice = (
                f"; the plan's proposals {' and '.join(tried)} do not fit either (compiled): "
                "lower dataset.max_prompt_tokens and dataset.max_new_tokens, use a smaller "
                "model, or a machine (or slice) with more memory"
            )
    return advice


def _footprint_source(result: CompiledRun) -> str:
    if any(p.peak for p in result.programs):
        return " (footprint: XLA-TPU's peak of the program's buffers, not argument + temp)"
    return " (footprint: argument + output - alias + temp)"


def describe_compiled(result: CompiledRun, setup: Setup, confirmed=None) -> str:
    """The whole report of one run."""
    m = setup.model
    xla = "XLA for CPU" if result.target == "cpu" else "XLA for TPU"
    head = (
        f"compiled for {result.target} ({setup.hardware.devices} devices) with {xla}: "
        f"{m.name}, {_depth(result, m.num_layers)}; GiB per device, peak = footprint + state "
        f"alive beside it{_footprint_source(result)}; {result.compile_seconds:.0f} s of compiles"
    )
    note = _paged_note(result, setup)
    notes = [note] if note else []
    return "\n".join([head, *_rows(result), *notes, verdict_line(result, setup, confirmed)])


def _paged_note(result: CompiledRun, setup: Setup) -> str | None:
    """A TPU engine's paged cache: the layers its decode attends with the kernel, and why not
    the others (locoexp/model/paged_kernel.py)."""
    if result.target == "cpu" or not result.engine_compiled:
        return None
    if setup.rollout.kv_cache is not KVCacheKind.paged:
        return None
    dtype = jnp.dtype((setup.rollout.param_dtype or setup.model.param_dtype).value)
    return kernel_note(setup.model, setup.rollout.tensor_parallel, dtype)


def summarize_compiled(result: CompiledRun) -> str:
    """One sweep job's line: the verdict and each role's GiB per device (XLA, plan)."""
    verdict = "fits" if result.fits else "does not fit"
    return (
        f"{verdict} (XLA): trainer {_gib(result.role_peak('trainer'))} GiB "
        f"(plan {_gib(result.plan.trainer_peak)}), engine {_gib(result.role_peak('engine'))} "
        f"(plan {_gib(result.plan.engine_peak)}); {result.compile_seconds:.0f} s of compiles"
    )
