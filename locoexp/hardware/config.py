"""Schema of the `hardware` config group.

`cpu`: H local processes stand in for H hosts, each with its own CPU devices (the same code path
as a TPU slice; nothing but the chips is simulated). TPU v7x slices (Section 3): 4 chips per host,
2 TensorCores per chip exposed as JAX devices, about 94.7 GiB usable per device.
"""

import dataclasses
import enum
import os

from locoexp.errors import require


class ChipKind(enum.Enum):
    cpu = "cpu"
    tpu_v7x = "tpu_v7x"


@dataclasses.dataclass(kw_only=True)
class HardwareConfig:
    chip: ChipKind = ChipKind.cpu
    hosts: int = 1  # H
    chips_per_host: int = 1
    devices_per_chip: int = 1  # JAX devices per chip (v7x: 2 TensorCores)
    # None (hardware=cpu only): this machine's physical memory shared by all local devices.
    memory_per_device_gib: float | None = None
    chip_hour_price_usd: float = 0.0  # for cost-to-learn in money; 0 = unpriced
    # The jax.distributed coordinator's port: the local launcher's (hardware=cpu, on 127.0.0.1)
    # and the da trainer group's (on trainer host 0). 0 = pick a free port.
    coordinator_port: int = 0

    @property
    def devices_per_host(self) -> int:
        return self.chips_per_host * self.devices_per_chip

    @property
    def chips(self) -> int:
        return self.hosts * self.chips_per_host

    @property
    def devices(self) -> int:
        return self.hosts * self.devices_per_host

    def __post_init__(self):
        for key in ("hosts", "chips_per_host", "devices_per_chip"):
            value = getattr(self, key)
            require(
                value >= 1, f"hardware.{key}={value} is invalid: it must be a positive integer."
            )
        if self.memory_per_device_gib is None:
            require(
                self.chip is ChipKind.cpu,
                f"hardware.memory_per_device_gib must be set for hardware.chip={self.chip.value}.",
            )
            physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
            self.memory_per_device_gib = round(physical / self.devices, 1)
        require(
            self.memory_per_device_gib > 0,
            f"hardware.memory_per_device_gib={self.memory_per_device_gib} must be > 0.",
        )
        require(
            self.chip_hour_price_usd >= 0,
            f"hardware.chip_hour_price_usd={self.chip_hour_price_usd} must be >= 0.",
        )
        require(
            0 <= self.coordinator_port < 65536,
            f"hardware.coordinator_port={self.coordinator_port} must be in [0, 65535].",
        )
