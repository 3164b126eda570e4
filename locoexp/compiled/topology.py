"""A TPU slice's devices without the TPU: libtpu's topology description, for compiling.

`jax.experimental.topologies.get_topology_desc("tpu7x:2x2x2", platform="tpu").devices` are the
devices of an 8-chip v7x slice as XLA-TPU sees them; programs lowered with arguments sharded on
a mesh of them compile to XLA-TPU's own executables (`memory_analysis()`, `cost_analysis()`,
Mosaic kernels included) on a machine without a TPU. That needs libtpu (`jax[tpu]`), which a
CPU-only install lacks: `topology_devices` refuses in one sentence with the install command.

libtpu prints warnings about the missing accelerator while it loads (the accelerator type, the
worker hostnames); they say nothing about a compile, so they are kept off the terminal and shown
only if loading the topology fails. It owns the topology only: it never compiles.
"""

import contextlib
import os
import re
import tempfile
from typing import Any

import jax

from locoexp.errors import ConfigError
from locoexp.hardware.config import ChipKind, HardwareConfig

INSTALL = 'pip install "jax[tpu]==0.10.2"'
# libtpu's name of each chip kind's topologies ("<name>:<chips along each axis>")
LIBTPU_NAMES = {
    ChipKind.tpu_v5e: "v5e",
    ChipKind.tpu_v5p: "v5p",
    ChipKind.tpu_v6e: "v6e",
    ChipKind.tpu_v7x: "tpu7x",
}


def libtpu_installed() -> bool:
    try:
        import libtpu  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def topology_name(hardware: HardwareConfig) -> str:
    """libtpu's name of the slice, e.g. "tpu7x:2x2x2"; refuses hardware without one."""
    if hardware.chip not in LIBTPU_NAMES or hardware.topology is None:
        raise ConfigError(
            f"dry_run=compile compiles for a TPU slice, but hardware.chip={hardware.chip.value} "
            f"with hardware.topology={hardware.topology} names none; choose a hardware=tpu_* "
            "preset (tpu_v5e_8, tpu_v5p_8, tpu_v6e_8, tpu_v7x_8, ... up to 256 chips)."
        )
    return f"{LIBTPU_NAMES[hardware.chip]}:{hardware.topology}"


@contextlib.contextmanager
def _quiet_stderr():
    """Send file descriptor 2 to a temporary file (libtpu writes there from C++); its text is
    returned through the yielded list when the block raises."""
    caught: list[str] = []
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield caught
        except BaseException:
            sink.seek(0)
            caught.append(sink.read())
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def topology_devices(hardware: HardwareConfig) -> list[jax.Device]:
    """The slice's devices, host by host (each host's `devices_per_host` consecutive)."""
    name = topology_name(hardware)
    if not libtpu_installed():
        raise ConfigError(
            f"dry_run=compile compiles for hardware.chip={hardware.chip.value} with XLA for TPU, "
            f"which needs libtpu: install it with {INSTALL} (no TPU needed)."
        )
    # libtpu takes a machine-wide lock file when it loads, for the one process that owns the
    # TPU; a compile owns none, so concurrent compiles (a sweep's, the test workers') may share
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies  # noqa: PLC0415

    try:
        with _quiet_stderr():
            # libtpu's devices (untyped): a process_index and an id each
            devices: list[Any] = topologies.get_topology_desc(name, platform="tpu").devices
    except Exception as error:  # libtpu's own error for a topology it does not know
        raise ConfigError(
            f"libtpu does not know the topology {name} (hardware.topology="
            f"{hardware.topology}): {str(error).splitlines()[0]}; choose a hardware=tpu_* preset."
        ) from None
    devices = sorted(devices, key=lambda d: (d.process_index, d.id))
    per_host = len(devices) // (max(d.process_index for d in devices) + 1)
    if len(devices) != hardware.devices or per_host != hardware.devices_per_host:
        raise ConfigError(
            f"libtpu's topology {name} has {len(devices)} devices, {per_host} per host, but "
            f"hardware says {hardware.devices}, {hardware.devices_per_host} per host "
            "(hardware.hosts, chips_per_host, devices_per_chip); choose a hardware=tpu_* preset."
        )
    return devices


_AVAILABLE = re.compile(r"exceeds available HBM \(([\d.]+)G\)")


def available_hbm_gib(device: jax.Device) -> float:
    """The memory XLA-TPU lays a program out in on `device`, in GiB: a topology's devices
    report no memory statistics, so it is read from XLA's refusal of a program of 312 GiB of
    temporaries (a one-second compile). v5e 15.75, v6e 31.25, v5p 95.74, v7x 94.75 (libtpu
    0.0.42); the presets' `memory_per_device_gib` are these (v7x: the paper's 94.7)."""
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: PLC0415

    one = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    x = jax.ShapeDtypeStruct((1 << 20,), jnp.float32, sharding=one)
    huge = jax.jit(lambda x: jnp.cumsum(jnp.tile(x, 40_000).reshape(40_000, -1), axis=1)[:, ::1024])
    try:
        huge.lower(x).compile()
    except jax.errors.JaxRuntimeError as error:
        match = _AVAILABLE.search(str(error))
        if match:
            return float(match.group(1))
        raise
    raise RuntimeError(f"XLA fit 312 GiB of temporaries on {device.device_kind}")
