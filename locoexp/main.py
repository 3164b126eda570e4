"""`run(config)`: check the run, build its spec, start its processes, run its session.

check -> spec -> launch -> session. Everything that can refuse a run (memory fit, TP vs heads,
placement) is checked when the spec is built (`locoexp.session.build.build_spec`), before
anything is allocated or written; the task's own refusals (files, vocabulary, schedule) come
before the first step. With `hardware=cpu` and more than one host (or device per host) the run
continues in spawned local processes (`locoexp.placement.launch`); on a TPU slice (or CPU
machines whose hosts a cluster starts, `hardware.coordinator_address`) every host runs this same
function; under `da` this process is the Ray driver. Every placement then runs
the same lifecycle (`locoexp.session.lifecycle.run_session`).
"""

import json
from pathlib import Path
from typing import Any

from locoexp.checkpoint.state import latest_saved_step
from locoexp.checkpoint.stop import STOPPED_EXIT_CODES, RunStopped
from locoexp.compiled.startup import judged
from locoexp.config import Config, DryRun
from locoexp.metrics.run_output import RunFiles
from locoexp.placement.launch import (
    configure_cpu_devices,
    initialize_distributed,
    launch_local_processes,
)
from locoexp.preflight import compiled, plan
from locoexp.session.build import build_spec
from locoexp.session.lifecycle import run_session
from locoexp.session.spec import RunSpec


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
        print(compiled(config) if config.dry_run is DryRun.compile else plan(config), flush=True)
        return {"dry_run": config.dry_run.value}
    spec = build_spec(config, xla=judged(config))  # XLA's verdict where preflight compiled
    files = RunFiles(str(run_dir), resolved_config, sweep_name, progress)
    return launch(spec, files)


def launch(spec: RunSpec, files: RunFiles) -> dict[str, Any]:
    """Start the run's processes and run the session in each: local host processes on CPU, this
    process on a TPU host (joined to its slice) or as the `da` Ray driver."""
    layout, meet = spec.layout, spec.coordinator
    if layout.disaggregated:  # a Ray driver starts the hosts as actors
        return run_session(spec, files)
    processes, devices = layout.processes, layout.devices_per_process
    local = layout.cpu and not meet.cluster_started
    if local and (processes > 1 or devices > 1):
        # a run on this machine alone listens on loopback unless told (`listen_address`)
        assert meet.bind_address is not None
        code = launch_local_processes(
            run_session,
            (spec, files),
            num_processes=processes,
            devices_per_process=devices,
            coordinator_port=meet.port,
            bind_address=meet.bind_address,
        )
        if code in STOPPED_EXIT_CODES:  # every host checkpointed after a stop signal
            raise RunStopped(latest_saved_step(files.run_dir) or 0, code - 128)
        if code != 0:
            raise SystemExit(code)
        return json.loads((Path(files.run_dir) / "summary.json").read_text())
    if processes > 1:  # one host of a TPU slice, or of CPU machines a cluster started
        if layout.cpu:
            configure_cpu_devices(devices)
        initialize_distributed(
            coordinator=meet.address,
            num_processes=processes,
            process_id=meet.process_id,
            bind_address=meet.bind_address,
            timeout_s=meet.timeout_s,
            key="hardware.coordinator_address" if meet.address else None,
        )
    return run_session(spec, files)
