"""A compile child: `verdict.compile_run` in a process of its own, kept for the next compiles.

Every compile of a run's programs for a fit verdict runs here, never in the caller's process:

- the caller never creates a JAX backend (a host of a multi-host run must call
  `jax.distributed.initialize` first) and gets the compiler's memory back when the child ends;
- libtpu's CHECK failures abort the process rather than raise (libtpu 0.0.42.1 on a scanned SWE
  trainer past the device's memory; experiments/LOG.md, session 23): a dead child becomes one
  sentence naming the failed check, and the next compile starts a new child;
- one child serves a caller's compiles in turn (`python -m locoexp.compiled.worker`: a config
  in on stdin, its `CompiledRun` or refusal back on a pipe of its own, so that nothing the
  compiler prints on stdout can corrupt a reply), so a refusal's proposals, a sweep's jobs and
  `tools/compile_paper_cells.py`'s cells pay JAX's and libtpu's start once, and a program
  met again is not compiled again (`programs._SEEN` lives in the child).

`CompileWorker` is one child; `pooled(config)` the caller's child for the config's environment
(a CPU run's device count is in its XLA flags), kept until `close_pool()` or the caller exits.
"""

import contextlib
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import traceback

from locoexp.config import Config
from locoexp.errors import ConfigError
from locoexp.hardware.config import ChipKind

_LENGTH = struct.Struct("<Q")


def child_environment(config: Config) -> dict[str, str]:
    """The compile's environment: the CPU backend, with the run's device count on a CPU
    machine (a TPU slice's devices come from libtpu's topology, `topology.py`)."""
    from locoexp.placement.launch import cpu_device_flags  # noqa: PLC0415

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if config.hardware.chip is ChipKind.cpu:
        env["XLA_FLAGS"] = cpu_device_flags(config.resolved_hardware.devices)
    return env


def _send(stream, message) -> None:
    data = pickle.dumps(message)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream):
    """The next message, or None at the end of the stream (the other side is gone)."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    data = stream.read(_LENGTH.unpack(head)[0])
    return pickle.loads(data)


class CompileWorker:
    """One compile child for configs of one environment."""

    def __init__(self, env: dict[str, str]):
        replies, self._reply_end = os.pipe()
        # the child's stdout and stderr (libtpu's lines), read when it dies; closed by close()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115
        self._process = subprocess.Popen(
            [sys.executable, "-m", "locoexp.compiled.worker", str(self._reply_end)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=self._log,
            pass_fds=(self._reply_end,),
        )
        os.close(self._reply_end)
        self._replies = os.fdopen(replies, "rb")

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def compile(self, config: Config):
        """XLA's `CompiledRun` for `config`; a refusal, or the compiler's death, in one
        sentence (`ConfigError`)."""
        try:
            _send(self._process.stdin, config)
            reply = _receive(self._replies)
        except BrokenPipeError:
            reply = None
        if reply is None:  # the child died mid-compile
            returncode = self._process.wait()
            self._log.seek(0)
            said = self._log.read().decode(errors="replace")
            self.close()
            if returncode < 0:  # killed by a signal (libtpu's CHECK failures abort)
                raise ConfigError(compiler_died(config, returncode, said))
            raise RuntimeError(f"the compile child exited ({returncode}):\n{said[-4000:]}")
        kind, value = reply
        if kind == "refused":
            raise ConfigError(value)
        if kind == "failed":
            raise RuntimeError(f"the compile failed in its child process:\n{value}")
        return value

    def close(self) -> None:
        if self._process.stdin and not self._process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self._process.stdin.close()  # the child reads the end and exits
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._replies.close()
        self._log.close()


def compiler_died(config: Config, returncode: int, said: str) -> str:
    """One sentence for a compile child killed by a signal: XLA's own check that failed (libtpu
    0.0.42.1 aborts, rather than refusing, on a scanned SWE trainer past the device's memory;
    experiments/LOG.md, session 23). The run's own compile would meet the same compiler."""
    checks = [line for line in said.splitlines() if "Check failed" in line]
    check = checks[0].split("] ", 1)[-1].strip() if checks else f"signal {-returncode}"
    return (
        f"XLA could not compile the run's programs for {config.hardware.chip.value}: the "
        f"compiler aborted ({check}); `dry_run=true` prints the plan, and a smaller "
        "dataset.prompts_per_step or trainer.micro_batch_rows may compile."
    )


_POOL: dict[tuple, CompileWorker] = {}


def pooled(config: Config) -> CompileWorker:
    """This process's compile child for `config`'s environment (a new one where it died)."""
    env = child_environment(config)
    key = (env["JAX_PLATFORMS"], env.get("XLA_FLAGS", ""))
    worker = _POOL.get(key)
    if worker is None or not worker.alive:
        worker = _POOL[key] = CompileWorker(env)
    return worker


def compile_pooled(config: Config):
    """`verdict.compile_run(config)` in this process's pooled compile child."""
    return pooled(config).compile(config)


def close_pool() -> None:
    """End every pooled child (their compiler memory returns to the machine)."""
    while _POOL:
        _POOL.popitem()[1].close()


def _serve(reply_fd: int) -> int:
    """The child: compile each config read from stdin and send back its result."""
    import jax  # noqa: PLC0415

    from locoexp.compiled.verdict import compile_run  # noqa: PLC0415

    requests, replies = sys.stdin.buffer, os.fdopen(reply_fd, "wb")
    while (config := _receive(requests)) is not None:
        cpu = config.hardware.chip is ChipKind.cpu
        reply: tuple[str, object]
        try:
            reply = ("done", compile_run(config, devices=jax.devices() if cpu else None))
        except ConfigError as error:
            reply = ("refused", str(error))
        except Exception:  # noqa: BLE001  (the caller raises it, with this child's traceback)
            reply = ("failed", traceback.format_exc())
        _send(replies, reply)
    return 0


if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1])))
