"""Starting the processes of a run: one per host, joined by `jax.distributed`.

On a TPU slice the cluster starts one process per host and each initialises from the
environment. With `hardware=cpu` this module plays the cluster: it spawns one process per host on
this machine, each with its own CPU devices (`--xla_force_host_platform_device_count`) and gloo
collectives, coordinator on 127.0.0.1. It is the same code path afterwards: nothing is simulated
except the chips. Process 0 owns the run directory; if any process fails, the others are stopped
(no orphans), and a process whose parent dies is killed by the kernel (PR_SET_PDEATHSIG).

This module must not import jax at module level: the device count has to be set first.
"""

import contextlib
import ctypes
import multiprocessing
import os
import re
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1


def configure_cpu_devices(count: int) -> None:
    """Expose `count` CPU devices to this process; must run before jax creates its backend."""
    flags = re.sub(
        r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", "")
    )
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def initialize_distributed(
    *, coordinator: str | None, num_processes: int, process_id: int | None
) -> None:
    """Join the run's `jax.distributed` group (gloo collectives on CPU). A no-op for one process
    with no coordinator; with `coordinator=None` on TPU, JAX reads the slice's environment."""
    import jax  # noqa: PLC0415  (after configure_cpu_devices)

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if coordinator is None:
        if num_processes > 1:
            jax.distributed.initialize()  # a TPU slice: the cluster's environment says who we are
        return
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )


def _die_with_parent() -> None:
    with contextlib.suppress(OSError):  # not Linux: the parent's monitor still stops us on failure
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _process_main(
    target: Callable[..., Any],
    args: tuple,
    *,
    process_id: int,
    num_processes: int,
    devices: int,
    coordinator: str,
) -> None:
    _die_with_parent()
    configure_cpu_devices(devices)
    if num_processes > 1:
        initialize_distributed(
            coordinator=coordinator, num_processes=num_processes, process_id=process_id
        )
    else:
        import jax  # noqa: PLC0415

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from locoexp.errors import ConfigError  # noqa: PLC0415

    # On failure, exit at once: a normal exit would first wait on jax.distributed's shutdown
    # barrier for the hosts that are still running.
    try:
        target(*args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        os._exit(2)
    except BaseException:  # noqa: BLE001  (any failure of a host ends the run)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def launch_local_processes(
    target: Callable[..., Any],
    args: tuple,
    *,
    num_processes: int,
    devices_per_process: int,
    coordinator_port: int = 0,
    poll_s: float = 0.2,
) -> int:
    """Run `target(*args)` in `num_processes` spawned processes, their `jax.distributed`
    coordinator on 127.0.0.1:`coordinator_port` (0: a free port); returns the first failing
    exit code (and stops the rest), or 0 when all succeed."""
    context = multiprocessing.get_context("spawn")
    coordinator = f"127.0.0.1:{coordinator_port or free_port()}"
    processes = [
        context.Process(
            target=_process_main,
            args=(target, args),
            name=f"locoexp-host-{p}",
            kwargs=dict(
                process_id=p,
                num_processes=num_processes,
                devices=devices_per_process,
                coordinator=coordinator,
            ),
        )
        for p in range(num_processes)
    ]
    for process in processes:
        process.start()
    try:
        while True:
            codes = [p.exitcode for p in processes]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                return failed[0]
            if all(c == 0 for c in codes):
                return 0
            time.sleep(poll_s)
    finally:
        _stop(processes)


def _stop(processes: list) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + 5.0
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
