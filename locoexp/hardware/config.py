"""Schema of the `hardware` config group.

`cpu`: H local processes stand in for H hosts, each with its own CPU devices (the same code path
as a TPU slice; nothing but the chips is simulated). TPU slices (`conf/hardware/tpu_*`): v5e, v5p,
v6e and v7x from 4 to 256 chips, each preset naming its libtpu topology (`topology`, the chips
along each axis), chips per host and memory per device. v7x (Section 3): 4 chips per host, 2
TensorCores per chip exposed as JAX devices, about 94.7 GiB usable per device.
"""

import dataclasses
import enum
import ipaddress
import math

from locoexp.errors import ConfigError, require

LOOPBACK = "127.0.0.1"


class ChipKind(enum.Enum):
    cpu = "cpu"
    tpu_v5e = "tpu_v5e"
    tpu_v5p = "tpu_v5p"
    tpu_v6e = "tpu_v6e"
    tpu_v7x = "tpu_v7x"


@dataclasses.dataclass(kw_only=True)
class HardwareConfig:
    chip: ChipKind = ChipKind.cpu
    # H. None (hardware=cpu): the smallest count the placement and split need, resolved by
    # `Config.hosts` and never written back (1 for co and single_controller; 4 for placement=da
    # split=0.25).
    hosts: int | None = None
    chips_per_host: int = 1
    devices_per_chip: int = 1  # JAX devices per chip (v7x: 2 TensorCores)
    # None (hardware=cpu only): the local hosts share this machine's physical memory, read from
    # the OS, and the memory plan checks their sum (locoexp/planner).
    memory_per_device_gib: float | None = None
    # A TPU slice's chips along each axis as libtpu names its topology ("2x2x2": 8 v7x chips),
    # what `dry_run=compile` compiles for (locoexp/compiled/topology.py); None on CPU.
    topology: str | None = None
    chip_hour_price_usd: float = 0.0  # for cost-to-learn in money; 0 = unpriced
    # The jax.distributed coordinator's port: the local launcher's (hardware=cpu, on 127.0.0.1)
    # and the da trainer group's (on trainer host 0). 0 = pick a free port.
    coordinator_port: int = 0
    # The interface the run's listening sockets bind to (the jax.distributed coordinator, the
    # local Ray cluster's services). None: 127.0.0.1 for a run on this machine (hardware=cpu,
    # placement.ray_address unset), all interfaces on a TPU slice or a joined Ray cluster, whose
    # hosts reach each other over the network. Multi-machine runs name their cluster-network
    # address here (README, "Security").
    bind_address: str | None = None
    # A run whose host processes a cluster starts, every machine running the same command (how a
    # TPU slice launches; with hardware=cpu, CPU machines joined the same way): host 0's
    # `address:port`, where the group's jax.distributed coordinator listens, and this process's
    # host index in [0, hosts) (the one value that differs per machine, e.g.
    # `hardware.process_id='${oc.env:RANK}'`). None: on a TPU slice JAX reads both from the
    # slice's environment; with hardware=cpu the launcher starts every host on this machine.
    coordinator_address: str | None = None
    process_id: int | None = None
    # Seconds a host waits for the jax.distributed group to assemble (every host registered with
    # the coordinator) before the run ends with a sentence naming the coordinator's address;
    # JAX's own default, which covers hosts that a cluster starts a few minutes apart.
    coordinator_timeout_s: int = 300

    @property
    def devices_per_host(self) -> int:
        return self.chips_per_host * self.devices_per_chip

    @property
    def platform(self) -> str:
        """The JAX backend these chips run ("cpu", "tpu"), for the kernel checks."""
        return "cpu" if self.chip is ChipKind.cpu else "tpu"

    @property
    def chips(self) -> int:
        return self._resolved_hosts * self.chips_per_host

    @property
    def devices(self) -> int:
        return self._resolved_hosts * self.devices_per_host

    @property
    def _resolved_hosts(self) -> int:
        # counts are read from `Config.resolved_hardware`, never from the user's unresolved copy
        if self.hosts is None:
            raise ValueError("hardware.hosts is unresolved here: read Config.resolved_hardware")
        return self.hosts

    def listen_address(self, *, multi_machine: bool) -> str | None:
        """`bind_address`, or its default: loopback unless the run spans machines."""
        if self.bind_address is not None:
            return self.bind_address
        spans = multi_machine or self.cluster_launched or self.chip is not ChipKind.cpu
        return None if spans else LOOPBACK

    def __post_init__(self):
        for key in ("hosts", "chips_per_host", "devices_per_chip"):
            value = getattr(self, key)
            require(
                value is None and key == "hosts" or value is not None and value >= 1,
                f"hardware.{key}={value} is invalid: it must be a positive integer.",
            )
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
        if self.bind_address is not None:
            try:
                ipaddress.ip_address(self.bind_address)
            except ValueError:
                raise ConfigError(
                    f"hardware.bind_address={self.bind_address} is not an IP address; give one "
                    "such as 127.0.0.1, this machine's cluster-network address, or 0.0.0.0."
                ) from None
        require(
            self.coordinator_timeout_s >= 1,
            f"hardware.coordinator_timeout_s={self.coordinator_timeout_s} must be a positive "
            "number of seconds.",
        )
        require(
            0 <= self.coordinator_port < 65536,
            f"hardware.coordinator_port={self.coordinator_port} must be in [0, 65535].",
        )
        self._check_cluster_launch()
        self._check_topology()

    def _check_topology(self) -> None:
        """`topology` names as many chips as the hosts hold (TPU slices only)."""
        if self.topology is None:
            return
        dims = self.topology.split("x")
        require(
            all(d.isdigit() and int(d) > 0 for d in dims) and len(dims) in (2, 3),
            f"hardware.topology={self.topology} must be the chips along each axis, such as "
            "2x2 (v5e, v6e) or 2x2x2 (v5p, v7x).",
        )
        chips = math.prod(int(d) for d in dims)
        if self.hosts is None:  # hardware=cpu: refused there (`locoexp.applies`)
            return
        require(
            chips == self.chips,
            f"hardware.topology={self.topology} has {chips} chips but hardware.hosts="
            f"{self.hosts} x hardware.chips_per_host={self.chips_per_host} is {self.chips}: "
            "choose a hardware=tpu_* preset, or set them to agree.",
        )

    def _check_cluster_launch(self) -> None:
        """`coordinator_address` and `process_id` name one host of a cluster-started group."""
        address, index = self.coordinator_address, self.process_id
        require(
            (address is None) == (index is None),
            f"hardware.coordinator_address={address} and hardware.process_id={index} go "
            "together: set both (a host of a cluster-started run) or neither.",
        )
        if address is None:
            return
        host, _, port = address.rpartition(":")
        require(
            bool(host) and port.isdigit() and 0 < int(port) < 65536,
            f"hardware.coordinator_address={address} must be host 0's address and port, such "
            "as 10.0.0.1:8476 ([fd00::1]:8476 for IPv6).",
        )
        if index is None or self.hosts is None or not 0 <= index < self.hosts:
            raise ConfigError(
                f"hardware.process_id={index} must be in [0, hardware.hosts) with hardware.hosts "
                f"set (hardware.hosts={self.hosts})."
            )

    @property
    def cluster_launched(self) -> bool:
        """This process is one host of a group that a cluster starts (not the local launcher)."""
        return self.coordinator_address is not None
