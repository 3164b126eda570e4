"""Entry point: `@hydra.main` and the command line; composition lives in `locoexp.compose`.

    python run.py                                   # the embedded default (tiny model, CPU)
    python run.py model=qwen3_0_6b dataset=gsm8k placement=da split=0.25
    python run.py -m algo=grpo,dr_grpo seed=0,1     # a sweep (Hydra multirun)

Nothing imports this module. Bad input is reported as one sentence on stderr with exit code 2
and no traceback, before Hydra creates the run directory.
"""

import os
import shlex
import signal
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from locoexp.checkpoint.stop import RunStopped
from locoexp.compose import compose_command_line, hydra_message, override_value, to_config
from locoexp.errors import ConfigError, RunFailed
from locoexp.placement.launch import exit_without_teardown


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from locoexp.main import run  # noqa: PLC0415  (jax loads only once the config is valid)

    hydra_cfg = HydraConfig.get()
    sweep = hydra_cfg.sweep.dir if hydra_cfg.mode.name == "MULTIRUN" else None
    config = to_config(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["hardware"]["chips"] = config.resolved_hardware.chips  # derived; W&B groups runs by it
    try:
        # the sweep's date/time directory names the W&B group of a multirun
        run(
            config,
            run_dir=hydra_cfg.runtime.output_dir,
            resolved_config=resolved,
            sweep_name=None if sweep is None else "/".join(sweep.rstrip("/").split("/")[-2:]),
        )
    except ConfigError as error:  # raised after start-up checks that need data (files, vocab)
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except RunFailed as failed:  # a da host that cannot be replaced died; Ray is stopped
        command = resume_command(hydra_cfg.runtime.output_dir)
        print(f"error: {failed}; resume with: {command}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except RunStopped as stopped:  # SIGTERM/SIGINT: the last finished step is checkpointed
        print(resume_line(stopped, hydra_cfg.runtime.output_dir), file=sys.stderr, flush=True)
        # Everything is on disk (checkpoint, records, logger closed); the interpreter's teardown
        # of the XLA client would take seconds more than the 5 s a stop may take.
        sys.stdout.flush()
        os._exit(stopped.exit_code)


def resume_command(run_dir: str) -> str:
    """This command with its run directory named: it resumes from the last checkpoint. Quoted
    twice: for Hydra's override parser (any directory name), then for the shell."""
    args = [a for a in sys.argv[1:] if not a.startswith("hydra.run.dir=")]
    return shlex.join(["python", "run.py", *args, f"hydra.run.dir={override_value(run_dir)}"])


def resume_line(stopped, run_dir: str) -> str:
    """One line: where the run stopped and the command that resumes it."""
    command = resume_command(run_dir)
    name = signal.Signals(stopped.signal_number).name
    if stopped.next_step == 0:  # stopped before its first checkpoint
        return f"stopped by {name} before the first checkpoint; start again with: {command}"
    return (
        f"stopped after {stopped.next_step} steps ({signal.Signals(stopped.signal_number).name}); "
        f"checkpoint in {run_dir}/checkpoints; resume with: {command}"
    )


def cli() -> None:
    try:
        jobs = compose_command_line(sys.argv[1:])
        from locoexp.preflight import check_jobs  # noqa: PLC0415  (jax loads once the configs hold)

        check_jobs(sys.argv[1:], jobs)
    except (ConfigError, OmegaConfBaseException, hydra.errors.HydraException, ValueError) as error:
        message = str(error) if isinstance(error, ConfigError) else hydra_message(error)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    if jobs and all(c.dry_run for _, c in jobs):  # print the plans; create no run directory
        from locoexp.preflight import dry_run_report  # noqa: PLC0415

        try:
            if len(jobs) > 1:  # each job's line as soon as it is planned (or compiled)
                dry_run_report(jobs, echo=lambda line: print(line, flush=True))
            else:
                print(dry_run_report(jobs), flush=True)
        except ConfigError as error:  # dry_run=compile: no libtpu, a topology it does not know
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        exit_without_teardown()
    main()
    exit_without_teardown()


if __name__ == "__main__":
    cli()
