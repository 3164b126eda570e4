"""Schema of the `hardware` config group.

`cpu`: H local processes stand in for H hosts, each with its own CPU devices (the same code path
as a TPU slice; nothing but the chips is simulated). TPU v7x slices (Section 3): 4 chips per host,
2 TensorCores per chip exposed as JAX devices, about 94.7 GiB usable per device.
"""

import dataclasses
import enum

from locoexp.errors import require


class ChipKind(enum.Enum):
    cpu = "cpu"
    tpu_v7x = "tpu_v7x"


@dataclasses.dataclass(kw_only=True)
class HardwareConfig:
    chip: ChipKind = ChipKind.cpu
    # H. None (hardware=cpu): the smallest count the placement and split need, resolved by the
    # root Config (1 for co and single_controller; 4 for placement=da split=0.25).
    hosts: int | None = None
    chips_per_host: int = 1
    devices_per_chip: int = 1  # JAX devices per chip (v7x: 2 TensorCores)
    # None (hardware=cpu only): the local hosts share this machine's physical memory, read from
    # the OS, and the memory plan checks their sum (locoexp/planner).
    memory_per_device_gib: float | None = None
    chip_hour_price_usd: float = 0.0  # for cost-to-learn in money; 0 = unpriced
    # The jax.distributed coordinator's port: the local launcher's (hardware=cpu, on 127.0.0.1)
    # and the da trainer group's (on trainer host 0). 0 = pick a free port.
    coordinator_port: int = 0

    @property
    def devices_per_host(self) -> int:
        return self.chips_per_host * self.devices_per_chip

    @property
    def platform(self) -> str:
        """The JAX backend these chips run ("cpu", "tpu"), for the kernel checks."""
        return {ChipKind.cpu: "cpu", ChipKind.tpu_v7x: "tpu"}[self.chip]

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
                value is None and key == "hosts" or value is not None and value >= 1,
                f"hardware.{key}={value} is invalid: it must be a positive integer.",
            )
        # Whether the root Config chose the host count (the dry-run plan says so).
        self.hosts_auto = self.hosts is None
        for key in ("hosts", "memory_per_device_gib"):
            require(
                getattr(self, key) is not None or self.chip is ChipKind.cpu,
                f"hardware.{key} must be set for hardware.chip={self.chip.value}.",
            )
        require(
            self.memory_per_device_gib is None or self.memory_per_device_gib > 0,
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
