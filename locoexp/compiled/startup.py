"""The start-up fit check: where the plan could be wrong, XLA's compile decides.

`preflight.check_run` calls `check_memory(config, job)` before the run directory is written or
anything is allocated. The plan (`locoexp.planner`) stays the quick, closed-form answer, in
milliseconds: the dry run (`dry_run=true`), the sizes it resolves and proposes (micro-batches,
capacity, the settings a refusal names) and the paper grids' verdicts in the tests. On a CPU
machine it decides alone while it uses at most `PLAN_ALONE_BELOW` of the memory it may use.
Above that, whenever it says the run does not fit, and for every run on a TPU slice, the run's
programs are compiled by XLA in a child process (`worker.py`): with
`hardware=cpu` on this machine's CPU with the run's device count, on a TPU slice for its
topology (libtpu; nothing is allocated on the chips). XLA's memory analysis
(`verdict.compile_run`) then decides: a run the plan refuses starts when XLA fits it, and a run
the plan fits is refused when XLA does not, in one sentence with XLA's figure and a proposal of
the plan that XLA compiled and fits.

The margin a "fits" keeps for what XLA's buffers leave out: on a CPU machine the local processes
may use 90% of its memory (`planner.plan.SHARED_MEMORY_USABLE`), each process counted with its
runtime (`PROCESS_OVERHEAD_GIB`) beside its devices' XLA peaks; on a TPU the device's memory is
XLA-TPU's own available HBM (the presets), which it already nets of its reservations.

The child runs the compiles so that this process never creates a JAX backend (a host of a
multi-host run must call `jax.distributed.initialize` first) and the compiler's own memory is
returned before the run allocates. Its verdict is kept for this process (`judged`), so that
`preflight.check_run` and `main.run` hand it to `session.build.build_spec`, which then follows
XLA rather than the plan.
"""

import dataclasses

from locoexp.compiled.worker import close_pool, compile_pooled
from locoexp.config import Config
from locoexp.errors import ConfigError
from locoexp.hardware.config import ChipKind
from locoexp.planner.fit import check_fit
from locoexp.planner.plan import Plan, capacity_bytes, shared_memory
from locoexp.session.build import plan_setup

# On a CPU machine the plan decides alone below this share of the memory: the largest XLA /
# plan ratio measured on a run's peak there is 1.75 (Qwen3-0.6B on GSM8K, co: XLA 36.5 GiB for
# all processes against the plan's 20.9, the decode loop's temporaries; experiments/LOG.md,
# session 21), so a third leaves room for 3x. On a TPU slice no share is safe: the plan ranged
# from 0.11 to 1.41 of XLA-TPU's figure over the paper's cells compiled (LOG, session 22; 0.98 to
# 1.34 of its peak over four recompiled in session 26), so a run on a slice always compiles
# (`plan_decides`).
PLAN_ALONE_BELOW = 1 / 3

# repr(config) -> the config XLA compiled and fits (itself, or with a size left to the plan
# shrunk), in this process
_JUDGED: dict[str, Config] = {}
_SHRINK_TRIES = 2


def plan_share(config: Config, plan: Plan) -> float:
    """The share of the memory the plan uses: all local processes of a CPU machine together,
    or the larger role's peak per device."""
    limit = capacity_bytes(config.hardware)
    if shared_memory(config.hardware):
        return plan.machine_total / limit
    return max(plan.trainer_peak, plan.engine_peak) / limit


def plan_decides(config: Config, plan: Plan) -> bool:
    """Whether the plan alone may let `config` start: a CPU run below `PLAN_ALONE_BELOW` of the
    memory; never a TPU run."""
    cpu = config.hardware.chip is ChipKind.cpu
    return cpu and plan_share(config, plan) <= PLAN_ALONE_BELOW


def judged(config: Config) -> Config | None:
    """Where this process compiled `config` at start-up: the config XLA fits (`config`, or its
    auto-sized micro-batches or capacity shrunk until XLA fits them); else None (the plan's)."""
    return _JUDGED.get(repr(config))


def check_memory(config: Config, job: list[str] | None = None):
    """Compile `config`'s programs where the plan is not the whole answer and refuse (one
    sentence, `ConfigError`) what XLA does not fit; `job`, its command line, lets the refusal
    compile the plan's proposals. Returns XLA's `CompiledRun`, or None where the plan decided."""
    setup = plan_setup(config)
    plan = check_fit(setup, memory=False)  # TP and EP degrees refuse here, before any compile
    if plan_decides(config, plan):
        return None
    try:
        return _judge(config, job, setup)
    finally:
        close_pool()  # the compiler's memory returns before the run allocates


def _judge(config: Config, job: list[str] | None, setup):
    result = compile_in_child(config)
    if result.fits:
        _JUDGED[repr(config)] = config
        return result
    shrunk = _shrink(config, result)
    if shrunk is not None:
        _JUDGED[repr(config)] = shrunk[0]
        return shrunk[1]
    from locoexp.compiled.report import verdict_line  # noqa: PLC0415
    from locoexp.compiled.verdict import confirm_proposals  # noqa: PLC0415

    confirmed = None
    if job is not None:
        confirmed = confirm_proposals(job, result, compile_job=compile_in_child)
    line = verdict_line(result, setup, confirmed).split(": does not fit (XLA): ", 1)[1]
    raise ConfigError(
        f"does not fit: XLA compiled the run's programs for {result.target} before allocating "
        f"anything and {line} (the plan estimated {_plan_figure(result)}; `dry_run=compile` "
        "prints every program)."
    )


def _shrink(config: Config, result):
    """The plan's size for the role XLA found too large, where the user left it to the plan
    (`rollout.capacity=0`, `trainer.micro_batch_rows=0`), shrunk until XLA fits it: first to
    where the role's compiled peak, read as linear in the size above what does not grow with
    it (weights, optimizer state), meets the memory, then by halves (`_SHRINK_TRIES` compiles).
    Returns (the config, XLA's result) or None."""
    role = (
        result.refusals[0].role
        if result.refusals
        else max(("trainer", "engine"), key=result.role_peak)
    )
    plan = result.plan
    if role == "engine" and config.rollout.capacity == 0 and result.engine_compiled:
        size, fixed = plan.capacity, result.engine_weights
        fixed += result.trainer_state if result.colocated else 0

        def sized(n: int) -> Config:
            pages = plan.pool.pages if plan.pool else None  # the pool stays the plan's
            return dataclasses.replace(
                config, rollout=config.rollout.at_capacity(n, pool_pages=pages)
            )
    elif role == "trainer" and config.trainer.micro_batch_rows == 0 and config.trainer.accumulate:
        size, fixed = plan.trainer_shape.micro_batch_rows, result.trainer_state
        fixed += result.engine_weights if result.keeps_engine_weights else 0

        def sized(n: int) -> Config:
            trainer = dataclasses.replace(config.trainer, micro_batch_rows=n)
            return dataclasses.replace(config, trainer=trainer)
    else:
        return None
    peak = result.role_peak(role)
    over = (
        (result.machine_total - result.limit) / _role_devices(config, role)
        if result.shared
        else peak - result.limit
    )
    if result.refusals:
        over = max(over, peak - result.limit)
    target = int(size * (peak - over - fixed) / max(peak - fixed, 1.0))
    for _ in range(_SHRINK_TRIES):
        target = min(target, size - 1)
        if target < 1:
            return None
        tried = compile_in_child(sized(target))
        if tried.fits:
            return sized(target), tried
        target //= 2
    return None


def _role_devices(config: Config, role: str) -> int:
    """The local devices that hold the role's peak (co: every device holds both roles)."""
    r, per_host = plan_setup(config).layout, config.hardware.devices_per_host
    if r.colocated:
        return r.trainer_hosts * per_host
    return (r.trainer_hosts if role == "trainer" else r.rollout_hosts) * per_host


def _plan_figure(result) -> str:
    plan, gib = result.plan, 2**30
    if result.shared:
        return f"{plan.machine_total / gib:.2f} GiB together"
    peaks = (plan.trainer_peak / gib, plan.engine_peak / gib)
    return "trainer {:.2f}, engine {:.2f} GiB per device".format(*peaks)


def compile_in_child(config: Config):
    """`verdict.compile_run(config)` in this process's compile child (`worker.py`): XLA's
    `CompiledRun`, or a refusal or the compiler's death in one sentence."""
    return compile_pooled(config)
