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
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1
LOOPBACK = "127.0.0.1"
# jax's Cloud TPU cluster detection puts process 0's coordinator on this port
# (jax/_src/clusters/cloud_tpu_cluster.py, `coordinator_port`).
JAX_TPU_COORDINATOR_PORT = 8482
JOIN_TIMEOUT_S = 300  # jax.distributed.initialize's own `initialization_timeout` default
JOIN_GRACE_S = 10  # JAX's own timeout is this much later than ours: ours speaks first


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
    timeout_s: int = JOIN_TIMEOUT_S,
    key: str | None = None,
) -> None:
    """Join the run's `jax.distributed` group (gloo collectives on CPU). A no-op for one process
    with no coordinator; with `coordinator=None` on TPU, JAX reads the slice's environment.

    `bind_address`: the interface process 0's coordinator listens on (None: all interfaces, JAX's
    default); passed explicitly so that nothing of a local run listens beyond loopback.
    `timeout_s`: how long the group may take to assemble; past it the process ends with one
    sentence naming `coordinator` (and `key`, the config key that gave it) and exit code 2,
    where JAX would abort with a C++ check failure."""
    import jax  # noqa: PLC0415  (after configure_cpu_devices)

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    deadline = JoinDeadline(timeout_s, coordinator, key=key, process_id=process_id)
    if coordinator is None:
        if num_processes > 1:  # a TPU slice: the cluster's environment says who we are
            bind = bind_address and host_port(bind_address, JAX_TPU_COORDINATOR_PORT)
            with deadline.watch():
                jax.distributed.initialize(
                    coordinator_bind_address=bind, initialization_timeout=deadline.jax_timeout_s()
                )
        return
    if process_id != 0:  # host 0 serves the coordinator; the others wait until it listens
        deadline.wait_for_listener()
    port = coordinator.rsplit(":", 1)[1]
    with deadline.watch():
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            coordinator_bind_address=bind_address and host_port(bind_address, port),
            initialization_timeout=deadline.jax_timeout_s(),
        )


class JoinDeadline:
    """The time a host has to join its group. JAX's `initialize` cannot be interrupted and,
    past its `initialization_timeout`, aborts the process with a C++ check failure (a stack
    trace that names no key); so it is given a few seconds more than what is left, and a timer
    ends the process first with the sentence (the call releases the GIL while it waits)."""

    def __init__(self, timeout_s: int, coordinator: str | None, *, key, process_id) -> None:
        self.timeout_s, self.end = timeout_s, time.monotonic() + timeout_s
        where = coordinator or "the address the TPU slice's environment names"
        named = f"{key}={coordinator}" if key else f"the coordinator at {where}"
        self.host = "this host" if process_id is None else f"host {process_id}"
        self.where = f"the jax.distributed coordinator ({named})"
        self.coordinator, self.key = coordinator, key

    def jax_timeout_s(self) -> int:
        return int(max(0.0, self.end - time.monotonic())) + JOIN_GRACE_S

    def _fix(self) -> str:
        given = self.key or "the coordinator's address"
        return (
            f"start every host, check that {given} is host 0's reachable address:port, or raise "
            f"hardware.coordinator_timeout_s={self.timeout_s}."
        )

    def wait_for_listener(self) -> None:
        """Return once something listens at the coordinator's address; raise `ConfigError` if
        nothing does before the deadline."""
        from locoexp.errors import ConfigError  # noqa: PLC0415

        assert self.coordinator is not None, "only a named coordinator is waited for"
        host, port = self.coordinator.rsplit(":", 1)
        said = False
        while True:
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
                    return
            except OSError as error:
                if time.monotonic() >= self.end:
                    reason = error.strerror or str(error)
                    raise ConfigError(
                        f"{self.host} found nothing listening at {self.where} within "
                        f"{self.timeout_s} s ({reason}): {self._fix()}"
                    ) from None
            if not said:  # one line, not silence, while host 0 starts
                said = True
                print(
                    f"{self.host}: waiting up to {self.timeout_s} s "
                    f"(hardware.coordinator_timeout_s) for {self.where} to listen",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(min(1.0, max(0.0, self.end - time.monotonic())))

    @contextlib.contextmanager
    def watch(self):
        """Within this block, the deadline ends the process with its sentence and exit code 2."""
        message = (
            f"error: {self.host} could not join the run's group at {self.where} within "
            f"{self.timeout_s} s (not every one of its hosts registered): {self._fix()}"
        )

        def expire() -> None:
            print(message, file=sys.stderr, flush=True)
            os._exit(2)

        timer = threading.Timer(max(0.0, self.end - time.monotonic()), expire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()


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
    from locoexp.checkpoint.stop import RunStopped  # noqa: PLC0415
    from locoexp.errors import ConfigError  # noqa: PLC0415

    # On failure, exit at once: a normal exit would first wait on jax.distributed's shutdown
    # barrier for the hosts that are still running.
    try:
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
    if num_processes > 1:  # host 0's coordinator must outlive the others' last call
        import jax  # noqa: PLC0415

        jax.distributed.shutdown()
    exit_without_teardown()


def exit_without_teardown(code: int = 0) -> None:
    """End this process once everything is on disk (records, checkpoints, the logger finished,
    Ray stopped), without the interpreter's teardown: its collection of every module, compiled
    program and array was two fifths of a host's CPU time in a 4-step tiny run and over half of
    run.py's (py-spy, experiments/LOG.md, session 30)."""
    import logging  # noqa: PLC0415

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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
