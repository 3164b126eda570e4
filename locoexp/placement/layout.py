"""Who runs where: the one layout of a run's hosts, processes and devices, built from the
placement and the hardware. The planner reads it to size each role, the launcher to start the
processes, the Ray side to place the actors. The enum is the registry; `build_layout` is its one
builder. Jax-free.

- `co` (LoCoJAX-CO): one process per host; every host trains (FSDP over all devices) and
  generates on its own devices with its own engine; staleness 0.
- `single_controller` (the baseline, Pathways-style): one process holding every host's devices;
  it admits every request itself and its engine is one lockstep program over all devices;
  staleness 0. The same halves and loop as `co`, in one process.
- `da` (LoCoJAX-DA): one Ray actor per host; split x H hosts train as their own
  `jax.distributed` group, the others generate at most `placement.max_staleness` steps stale
  (the paper's 1), each at its own pace within that bound.
"""

import dataclasses
from typing import Any

from locoexp.errors import require
from locoexp.placement.config import PlacementKind


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layout:
    kind: PlacementKind
    hosts: int
    devices_per_host: int
    trainer_hosts: int
    rollout_hosts: int
    hosts_per_engine: int  # 1: host-local engines (LoCoJAX); H: one lockstep engine over all
    # the staleness bound s: batch t samples with the weights of an update >= t - s (0: on-policy)
    staleness: int
    cpu: bool  # hardware=cpu: hosts are local processes (or actors) with CPU devices
    # Where the processes meet: the jax.distributed coordinator (0: a free port) and the
    # interface every listening socket binds to (None: all; loopback for a local run).
    coordinator_port: int = 0
    bind_address: str | None = None
    # co whose hosts a cluster starts (hardware.coordinator_address): host 0's address:port and
    # this process's host index (None: the local launcher starts every host, or a TPU slice's
    # environment names both)
    coordinator_address: str | None = None
    process_id: int | None = None
    coordinator_timeout_s: int = 300  # how long the group may take to assemble
    # da only: the Ray cluster (None: a local one), each rollout host's restart budget, and the
    # local cluster's object store (planner.plan.object_store_bytes; None: Ray's default)
    ray_address: str | None = None
    rollout_restarts: int = 0
    rollout_restart_timeout_s: float = 600.0
    object_store_bytes: int | None = None

    def __post_init__(self) -> None:
        require(
            self.trainer_hosts >= 1 and self.rollout_hosts >= 1,
            "the trainer and the rollout engines each need at least one host.",
        )
        require(
            self.rollout_hosts % self.hosts_per_engine == 0,
            f"{self.rollout_hosts} rollout hosts do not split into engines of "
            f"{self.hosts_per_engine} hosts.",
        )

    @property
    def colocated(self) -> bool:
        """Every host trains and generates (co, single_controller)."""
        return self.kind is not PlacementKind.da

    @property
    def processes(self) -> int:
        """Processes the launcher starts (da: none; Ray starts the actors)."""
        match self.kind:
            case PlacementKind.co:
                return self.hosts
            case PlacementKind.single_controller:
                return 1
            case PlacementKind.da:
                return 0

    @property
    def devices_per_process(self) -> int:
        return self.hosts_per_engine * self.devices_per_host

    @property
    def local_processes(self) -> int:
        """Processes of a local CPU run: one per host, one in all for the single controller,
        plus the Ray driver under da."""
        if self.colocated:
            return self.processes
        return self.trainer_hosts + self.rollout_hosts + 1


def build_layout(
    kind: PlacementKind,
    *,
    hosts: int,
    devices_per_host: int,
    split: float | None = None,
    max_staleness: int = 1,
    cpu: bool = True,
    **meeting: Any,
) -> Layout:
    """The layout of `kind` on `hosts` hosts; `meeting`: Layout's coordinator and Ray fields."""
    trainer_hosts, per_engine, staleness = hosts, 1, 0
    match kind:
        case PlacementKind.co:
            pass
        case PlacementKind.single_controller:
            per_engine = hosts
        case PlacementKind.da:
            trainer_hosts, staleness = round((split or 0) * hosts), max_staleness
    return Layout(
        kind=kind,
        hosts=hosts,
        devices_per_host=devices_per_host,
        trainer_hosts=trainer_hosts,
        rollout_hosts=hosts - trainer_hosts if staleness else hosts,
        hosts_per_engine=per_engine,
        staleness=staleness,
        cpu=cpu,
        **meeting,
    )
