"""Starting the processes of a run: one per host, joined by `jax.distributed`.

On a TPU slice the cluster starts one process per host and each initialises from the
environment. With `hardware=cpu` this module plays the cluster: it spawns one process per host on
this machine, each with its own CPU devices (`--xla_force_host_platform_device_count`) and gloo
collectives, coordinator on 127.0.0.1 (`bind_address`: every socket of a local run listens on
loopback only; see the README's security note). It is the same code path afterwards: nothing is
simulated except the chips. Process 0 owns the run directory; if any process fails, the others
are stopped (no orphans), and a process whose parent dies is killed by the kernel
(PR_SET_PDEATHSIG).

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
LOOPBACK = "127.0.0.1"
# jax's Cloud TPU cluster detection puts process 0's coordinator on this port
# (jax/_src/clusters/cloud_tpu_cluster.py, `coordinator_port`).
JAX_TPU_COORDINATOR_PORT = 8482


def cpu_device_flags(count: int) -> str:
    """This process's `XLA_FLAGS` (the user's own: dumps, optimisation levels) with its device
    count replaced by `count`: what a host process or actor of this run starts with."""
    flags = re.sub(
        r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", "")
    )
    return f"{flags} --xla_force_host_platform_device_count={count}".strip()


def configure_cpu_devices(count: int) -> None:
    """Expose `count` CPU devices to this process; must run before jax creates its backend."""
    os.environ["XLA_FLAGS"] = cpu_device_flags(count)


def free_port(host: str = LOOPBACK) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def host_port(host: str, port: int | str) -> str:
    """`host:port`, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def initialize_distributed(
    *,
    coordinator: str | None,
    num_processes: int,
    process_id: int | None,
    bind_address: str | None = None,
) -> None:
    """Join the run's `jax.distributed` group (gloo collectives on CPU). A no-op for one process
    with no coordinator; with `coordinator=None` on TPU, JAX reads the slice's environment.

    `bind_address`: the interface process 0's coordinator listens on (None: all interfaces, JAX's
    default); passed explicitly so that nothing of a local run listens beyond loopback."""
    import jax  # noqa: PLC0415  (after configure_cpu_devices)

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if coordinator is None:
        if num_processes > 1:  # a TPU slice: the cluster's environment says who we are
            bind = bind_address and host_port(bind_address, JAX_TPU_COORDINATOR_PORT)
            jax.distributed.initialize(coordinator_bind_address=bind)
        return
    port = coordinator.rsplit(":", 1)[1]
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        coordinator_bind_address=bind_address and host_port(bind_address, port),
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
    bind_address: str,
) -> None:
    _die_with_parent()
    configure_cpu_devices(devices)
    if num_processes > 1:
        initialize_distributed(
            coordinator=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            bind_address=bind_address,
        )
    else:
        import jax  # noqa: PLC0415

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from locoexp.checkpoint.stop import RunStopped  # noqa: PLC0415
    from locoexp.errors import ConfigError  # noqa: PLC0415

    # On failure, exit at once: a normal exit would first wait on jax.distributed's shutdown
    # barrier for the hosts that are still running.
    try:
        target(*args)
    except RunStopped as stopped:  # every host checkpointed the same step; the parent reports
        sys.stdout.flush()
        os._exit(stopped.exit_code)
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
    bind_address: str = LOOPBACK,
    poll_s: float = 0.2,
) -> int:
    """Run `target(*args)` in `num_processes` spawned processes, their `jax.distributed`
    coordinator listening on `bind_address`:`coordinator_port` (0: a free port); returns the
    first failing exit code (and stops the rest), or 0 when all succeed."""
    context = multiprocessing.get_context("spawn")
    coordinator = host_port(bind_address, coordinator_port or free_port(bind_address))
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
                bind_address=bind_address,
            ),
        )
        for p in range(num_processes)
    ]
    for process in processes:
        process.start()
    forward = _forward_stop_signals(processes)
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
        forward.uninstall()
        _stop(processes)


class _forward_stop_signals:  # noqa: N801  (used like a function)
    """While the hosts run, SIGTERM/SIGINT to this parent are passed on to every host as they
    came (each checkpoints the same step and exits with 128 + the signal, a second Ctrl-C 130);
    the parent waits for them."""

    def __init__(self, processes: list):
        self.processes = processes
        self.previous = {
            n: signal.signal(n, self._forward) for n in (signal.SIGTERM, signal.SIGINT)
        }

    def _forward(self, number: int, frame) -> None:
        for process in self.processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, number)

    def uninstall(self) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)


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
