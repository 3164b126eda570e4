"""`check_run(config)`: every refusal of a run that needs this machine, before anything is written.

`run.py` calls it (through `check_jobs`) before Hydra creates the run directory,
so bad input ends as one sentence on stderr (exit code 2, no traceback) and leaves no directory
behind. The config's own invariants
(types, ranges, finite floats, GRPO group size >= 2, training temperature > 0) are checked when
the typed `Config` is built; this module adds what needs the machine, cheapest first:

- memory fit, TP vs heads and placement: the plan, and XLA's compile where the plan could be
  wrong (`compiled.startup.check_memory`; `session.build.build_spec`, which `main.run`
  repeats, is handed XLA's verdict);
- the rollout engine installed (`rollout=vllm` without vLLM: the pinned install command) and
  its platform settings;
- the W&B logger: online needs local credentials and a server that answers within 2 s, unless
  `logger.offline_fallback` (or an automatic online mode) lets it log offline with a notice;
- the checkpoint: directory, config.json, every weight file a readable safetensors file (from
  its header: never unpickled, no tensor read), tensor names and shapes;
- the data: local files row by row (file and 1-based line), the columns the task reads, then the
  rows as `datasets` loads them (the run reads them again from its cache); a Hub source on a
  machine without network is refused in 2 s instead of retried for 30 s;
- the tokenizer's vocabulary against `model.vocab_size`;
- the prompt schedule (steps vs batches and passes) against the training rows, an upper bound
  of the examples: a schedule that needs more examples than remain after long prompts are
  dropped is still refused when the task is built, after the run directory exists;
- the run directory (`hydra.run.dir`): it can be made and written, its disk holds what the run
  writes (checkpoints and exports, from the memory plan's state sizes), and a run already in it
  may be continued by this config (`resume`, the same settings); Hydra's `.hydra/` and
  `run.log` would otherwise overwrite the records of the run it refuses;
- a local run's listening address is this machine's and its coordinator port is free.

It may read files, fill the `datasets` cache and open one TCP connection per server. It must not
create the run directory, build a model or initialise a JAX backend (a multi-host TPU process
must call `jax.distributed.initialize` first).
"""

import errno
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from locoexp.applies import unread_notices
from locoexp.checkpoint.export import POLICY_DIR
from locoexp.checkpoint.state import (
    CHECKPOINT_DIR,
    KEPT_CHECKPOINTS,
    check_same_config,
    latest_saved_step,
    resume_step,
    saved_progress,
)
from locoexp.compiled.startup import check_memory, judged
from locoexp.compiled.topology import topology_devices
from locoexp.compose import compose_command_line, experiment_sweep, run_directories
from locoexp.config import Config, DryRun
from locoexp.dataset.build import needed_columns
from locoexp.dataset.config import DatasetConfig, DatasetKind
from locoexp.dataset.files import check_data_files, check_held_out_apart
from locoexp.dataset.schedule import build_schedule
from locoexp.errors import ConfigError, require
from locoexp.hardware.config import ChipKind
from locoexp.layout import Layout
from locoexp.metrics.config import LoggerKind
from locoexp.metrics.wandb_logger import checked_mode
from locoexp.model.checkpoint import check_checkpoint
from locoexp.placement.coordinator import CoordinatorSpec
from locoexp.placement.ray.spec import RaySpec
from locoexp.planner import describe_plan
from locoexp.planner.fit import resolve_plan
from locoexp.planner.report import summarize_plan
from locoexp.rollout.config import EngineKind
from locoexp.session.build import build_spec, plan_setup
from locoexp.session.spec import SurvivalSpec


def preflight(argv: list[str]) -> list[tuple[list[str], Config]]:
    """Every job of a command line composed (`compose.compose_command_line`) and checked
    (`check_jobs`), as `run.py` does before Hydra starts. Returns (overrides, config) per job."""
    jobs = compose_command_line(argv)
    check_jobs(argv, jobs)
    return jobs


def check_jobs(argv: list[str], jobs: list[tuple[list[str], Config]]) -> None:
    """Each composed job of the command line `argv`: its start-up warnings on stderr, then
    (`check_run`) every refusal that needs this machine, named by the job in a sweep; a
    `dry_run=compile` on a TPU slice needs libtpu and the slice's topology."""
    run_dirs = run_directories(argv, len(jobs))
    for (job, config), run_dir in zip(jobs, run_dirs, strict=True):
        name = f"job {' '.join(job)}: " if len(jobs) > 1 else ""
        for notice in start_up_warnings(config):
            print(f"warning: {name}{notice}", file=sys.stderr, flush=True)
        tpu = config.hardware.chip is not ChipKind.cpu
        try:
            if config.dry_run is DryRun.compile and tpu:  # libtpu and the slice, before compiling
                topology_devices(config.hardware)
            if not config.dry_run:
                check_run(config, run_dir=run_dir, job=job)
        except ConfigError as error:
            raise ConfigError(f"{name}{error}") from error


def check_run(config: Config, *, run_dir: Path | None = None, job: list[str] | None = None) -> None:
    """Raise `ConfigError` (one sentence) for the first refusal of `config` on this machine;
    `run_dir`: where Hydra will write the run (None: not checked); `job`: its command line (a
    refusal from XLA's compile then compiles the plan's proposals)."""
    check_memory(config, job)
    spec = build_spec(config, xla=judged(config))
    if run_dir is not None:
        check_run_directory(run_dir, spec.survival)
        check_disk_space(run_dir, config)
    check_listening(spec.layout, spec.ray, spec.coordinator)
    if config.rollout.engine is EngineKind.vllm:
        from locoexp.rollout import vllm_engine  # noqa: PLC0415

        platform = "tpu" if config.hardware.chip is ChipKind.tpu_v7x else "cpu"
        vllm_engine.require_vllm(platform)
        vllm_engine.platform_kwargs(config.rollout, platform)
    if config.logger.kind is LoggerKind.wandb:
        checked_mode(config.logger)
    check_checkpoint(config.model)
    match config.dataset.kind:
        case DatasetKind.synthetic:
            rows = config.dataset.synthetic.train_size
        case DatasetKind.random_tokens:
            rows = config.dataset.random_tokens.train_size
        case _:
            rows = check_data(config.dataset)
            check_vocabulary(config)
    # An upper bound of the training examples (long prompts are dropped later): what the rows
    # cannot give is refused here, the rest when the task is built.
    build_schedule(config.dataset, steps=config.steps, num_examples=rows)


def start_up_warnings(config: Config) -> list[str]:
    """Settings that are valid but do less than they seem to, one sentence each: the keys of
    `locoexp.applies`' notice rows set where nothing reads them (`rollout.straggler.host` in a
    sweep's delay 0 cell, or a slip)."""
    return unread_notices(config, config.traits)


def plan(config: Config) -> str:
    """The dry-run report: hosts, devices per role, memory per device, parameters, verdict."""
    note = ""
    if config.hardware.hosts is None:
        split = f" split={config.split}" if config.split is not None else ""
        note = (
            f"hardware.hosts={config.hosts} chosen: the smallest count "
            f"placement={config.placement.kind.value}{split} needs"
        )
    return describe_plan(plan_setup(config), hosts_note=note)


def compiled(config: Config, job: list[str] | None = None) -> str:
    """The `dry_run=compile` report: every program compiled by XLA for the run's TPU slice, or
    (`hardware=cpu`) for this machine's CPU; a run that does not fit (given its command line
    `job`) also compiles the plan's proposals."""
    from locoexp.compiled.report import describe_compiled  # noqa: PLC0415
    from locoexp.compiled.verdict import confirm_proposals  # noqa: PLC0415

    compile_job = _compiler(config)
    result = compile_job(config)
    confirmed = None
    if not result.fits and job is not None:
        confirmed = confirm_proposals(job, result, compile_job=compile_job)
    return describe_compiled(result, plan_setup(config), confirmed)


def _compiler(config: Config):
    """`compile_run` in this process's compile child (`compiled/worker.py`): for a TPU slice
    libtpu's topology, for `hardware=cpu` the run's CPU devices; the child is kept for the
    proposals and a sweep's other jobs, and a compiler that aborts is one sentence."""
    from locoexp.compiled.worker import compile_pooled  # noqa: PLC0415

    return compile_pooled


def _summary(config: Config) -> str:
    if config.dry_run is not DryRun.compile:
        return summarize_plan(plan_setup(config))
    from locoexp.compiled.report import summarize_compiled  # noqa: PLC0415

    return summarize_compiled(_compiler(config)(config))


def dry_run_report(jobs: list[tuple[list[str], Config]], *, echo=None) -> str:
    """`dry_run=true`: one job's whole plan; a sweep's, one line per job (the overrides that set
    it apart, the verdict, GiB per device of each role, micro-batches, waves). `dry_run=compile`:
    the same from XLA's compiled programs; `echo` receives each sweep line as it is ready (a
    sweep of compiles takes minutes a job)."""
    if len(jobs) == 1:
        job, config = jobs[0]
        sweep = experiment_sweep(job) if any(o.startswith("+experiment=") for o in job) else []
        verb = "compile" if config.dry_run is DryRun.compile else "plan"
        note = (
            f"\n(one job: this experiment sweeps {', '.join(sweep)}; {verb} every job with -m)"
            if sweep
            else ""
        )
        report = compiled(config, job) if config.dry_run is DryRun.compile else plan(config)
        return report + note
    shared = set.intersection(*(set(job) for job, _ in jobs))
    lines = [f"{len(jobs)} jobs ({' '.join(jobs[0][0])}, ...):"]
    if echo is not None:
        echo(lines[0])
    for number, (job, config) in enumerate(jobs):
        cell = " ".join(o for o in job if o not in shared)
        try:
            summary = _summary(config)
        except ConfigError as error:  # one job's refusal (a topology, libtpu) ends the sweep
            raise ConfigError(f"job {number} {cell}: {error}") from None
        lines.append(f"job {number} {cell}: {summary}")
        if echo is not None:
            echo(lines[-1])
    return "\n".join(lines)


def check_data(dataset: DatasetConfig) -> int:
    """The training and held-out rows exist, parse and carry the columns the task reads;
    returns the number of training rows."""
    from locoexp.dataset.load import load_rows  # noqa: PLC0415  (`datasets`: only for files)

    columns = needed_columns(dataset.kind)
    for key in ("data_files", "eval_data_files"):
        pattern = getattr(dataset, key)
        if dataset.data_files is not None and pattern is not None:
            check_data_files(pattern, key=key, columns=columns)
    if dataset.data_files is not None and dataset.eval_data_files is not None:
        check_held_out_apart(dataset.data_files, dataset.eval_data_files)
    features = None
    if dataset.kind is DatasetKind.swe_agent:
        from locoexp.dataset.swe_task import FEATURES as features  # noqa: PLC0415, N811
    train_rows = 0
    for held_out in (False, True):
        rows = load_rows(dataset, held_out=held_out, features=features)
        if rows is None:
            continue
        train_rows = train_rows or len(rows)
        missing = [c for c in columns if c not in rows.column_names]
        files = dataset.eval_data_files if held_out else dataset.data_files
        source = dataset.path if dataset.data_files is None else files
        require(
            not missing,
            f"dataset={dataset.kind.value} reads the column(s) {', '.join(missing)}, which the "
            f"rows of {source} lack (they have {', '.join(rows.column_names)}).",
        )
    return train_rows


def check_vocabulary(config: Config) -> None:
    """The model's vocabulary covers the tokenizer the task will encode with."""
    from locoexp.tokenizer import build_tokenizer  # noqa: PLC0415

    tokens = build_tokenizer(config.model.checkpoint).vocab_size
    require(
        tokens <= config.model.vocab_size,
        f"model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's {tokens} "
        f"tokens of dataset={config.dataset.kind.value}; pick a model whose vocabulary covers "
        "it (e.g. model=tiny_qwen).",
    )


def check_run_directory(run_dir: Path, survival: SurvivalSpec) -> None:
    """`hydra.run.dir` is (or can be made) a writable directory, and the checkpoint in it, if
    any, is one this config resumes (`checkpoint.state.resume_step`, `check_same_config`)."""
    require(
        not run_dir.exists() or run_dir.is_dir(),
        f"hydra.run.dir={run_dir} is an existing file, not a directory; give a new or existing "
        "directory path.",
    )
    existing = next(p for p in (run_dir, *run_dir.resolve().parents) if p.exists())
    try:  # what Hydra will do: make directories under the nearest existing one and write there
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as error:
        raise ConfigError(
            f"hydra.run.dir={run_dir} cannot be written ({existing}: {error.strerror}); give a "
            "directory on a writable file system, e.g. hydra.run.dir=outputs/<name>."
        ) from None
    directory = run_dir.resolve() / CHECKPOINT_DIR
    step = resume_step(survival.resume, latest_saved_step(run_dir), directory)
    if step is not None:
        check_same_config(saved_progress(run_dir, step), survival.config_digest, directory)


def check_disk_space(run_dir: Path, config: Config) -> None:
    """The disk under `run_dir` holds the run's checkpoints (`KEPT_CHECKPOINTS`, and the next
    one written before the oldest goes) and its policy exports, less what the run directory
    already holds of them: the plan's trainer state (AdamW m and v of what trains, that as
    much again in parameters, the KL reference) and parameters, over its devices."""
    plan = resolve_plan(plan_setup(config))
    t, devices = plan.trainer, plan.trainer_devices
    checkpoint = int((1.5 * t.optimizer + t.reference) * devices)
    policy = t.params * devices
    exports = 1 + len(config.eval_at_updates)
    need = (KEPT_CHECKPOINTS + 1) * checkpoint + exports * policy
    held = sum(
        f.stat().st_size
        for part in (CHECKPOINT_DIR, POLICY_DIR)
        for f in (run_dir / part).rglob("*")
        if f.is_file()
    )
    existing = next(p for p in (run_dir, *run_dir.resolve().parents) if p.exists())
    free = shutil.disk_usage(existing).free
    mib = 2**20
    require(
        need - held <= free,
        f"hydra.run.dir={run_dir} is on a disk with {free / mib:.1f} MiB free, but this run "
        f"writes about {(need - held) / mib:.1f} MiB there ({KEPT_CHECKPOINTS + 1} checkpoints "
        f"of {checkpoint / mib:.1f} MiB while the newest replaces the oldest, and {exports} "
        f"policy export(s) of {policy / mib:.1f} MiB); free space or give a hydra.run.dir on a "
        "larger disk.",
    )


def check_listening(layout: Layout, ray: RaySpec | None, meet: CoordinatorSpec) -> None:
    """A run on this machine (hardware=cpu, no placement.ray_address) listens on
    `hardware.bind_address`, which must be one of this machine's addresses, and, with several
    processes, the jax.distributed coordinator on `hardware.coordinator_port`, which must be free
    (0: the launcher picks a free one)."""
    if not layout.cpu or (ray is not None and ray.joined) or meet.bind_address is None:
        return
    address = meet.bind_address
    uses_port = layout.processes > 1 or layout.disaggregated
    port = meet.port if uses_port else 0
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds it
        try:
            probe.bind((address, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"hardware.coordinator_port={port} is already in use on {address}; set "
                    "hardware.coordinator_port to a free port, or 0 to let the run pick one."
                ) from None
            raise ConfigError(
                f"hardware.bind_address={address} is not an address of this machine "
                f"({error.strerror}); give one of its own addresses, or leave it unset for "
                "127.0.0.1."
            ) from None
