"""Who runs where: the one layout of a run's hosts, processes and devices, built from the
placement and the hardware, and the arithmetic of a `da` split. The planner reads it to size each
role, the launcher to start the processes, the session to pick the transport, the Ray side to
place the actors. Code asks the layout's properties (`colocated`, `lockstep`, `on_policy`,
`processes`, `engines`), never the placement's name: `kind` names the run in records and
sentences. `PlacementKind` is the registry and `build_layout` its one builder: with
`minimal_hosts` (the host count a kind needs before there is a layout), the only code that
asks the kind. A jax-free leaf: it imports nothing of locoexp but `errors`.

- `co` (LoCoJAX-CO): one process per host; every host trains (FSDP over all devices) and
  generates on its own devices with its own engine; staleness 0.
- `single_controller` (the baseline, Pathways-style): one process holding every host's devices;
  it admits every request itself and its engine is one lockstep program over all devices;
  staleness 0. The same halves and loop as `co`, in one process.
- `da` (LoCoJAX-DA): one Ray actor per host; split x H hosts train as their own
  `jax.distributed` group, the others generate at most `placement.max_staleness` steps stale
  (the paper's 1), each at its own pace within that bound. Ray's own knobs (its address, the
  restarts, the object store) are the Ray transport's (`placement.ray.spec.RaySpec`), and where
  the processes meet (the coordinator, the bind address) the launcher's
  (`placement.coordinator.CoordinatorSpec`), not here.

The layout names the transport that carries its step (`TransportKind`): the session looks it up
(`session.lifecycle.OPEN_TRANSPORT`) instead of asking whether the roles are apart.
"""

import dataclasses
import enum

from locoexp.errors import ConfigError, require


class TransportKind(enum.Enum):
    in_process = "in_process"  # both halves in every host process (placement.inprocess)
    ray = "ray"  # the halves in Ray actors, the loop in a driver (placement.ray)


class PlacementKind(enum.Enum):
    co = "co"  # colocated: every host trains (FSDP over all devices) and runs its own engine
    da = "da"  # disaggregated on Ray: trainer hosts and rollout hosts, one-step-stale rollouts
    single_controller = "single_controller"  # one process drives every device (the baseline)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layout:
    kind: PlacementKind  # the name, for records and sentences; code asks the properties below
    hosts: int
    devices_per_host: int
    trainer_hosts: int
    rollout_hosts: int
    hosts_per_engine: int  # 1: host-local engines (LoCoJAX); H: one lockstep engine over all
    # the staleness bound s: batch t samples with the weights of an update >= t - s (0: on-policy)
    staleness: int
    cpu: bool  # hardware=cpu: hosts are local processes (or actors) with CPU devices
    transport: TransportKind  # what carries a step between the halves

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
        apart = self.trainer_hosts + self.rollout_hosts == self.hosts
        require(
            apart or self.trainer_hosts == self.rollout_hosts == self.hosts,
            f"{self.trainer_hosts} trainer and {self.rollout_hosts} rollout hosts are neither "
            f"every one of the {self.hosts} hosts (colocated) nor apart (disaggregated).",
        )
        require(
            self.colocated or self.transport is not TransportKind.in_process,
            "trainer and rollout hosts apart need a transport between processes, not in_process.",
        )

    @property
    def colocated(self) -> bool:
        """Every host trains and generates (co, single_controller); else the trainer hosts and
        the rollout hosts are apart (da), and a Ray driver starts them as actors."""
        return self.trainer_hosts == self.hosts

    @property
    def disaggregated(self) -> bool:
        return not self.colocated

    @property
    def on_policy(self) -> bool:
        """Batch t samples with the weights of update t-1 (staleness 0)."""
        return self.staleness == 0

    @property
    def lockstep(self) -> bool:
        """One engine spans several hosts, as one program (the single controller)."""
        return self.hosts_per_engine > 1

    @property
    def engines(self) -> int:
        """Rollout engines: each admits and generates its own share of a batch."""
        return self.rollout_hosts // self.hosts_per_engine

    @property
    def processes(self) -> int:
        """Processes the launcher starts: one per engine when colocated (each engine's process
        trains too), none when disaggregated (Ray starts the actors)."""
        return self.engines if self.colocated else 0

    @property
    def devices_per_process(self) -> int:
        return self.hosts_per_engine * self.devices_per_host

    @property
    def local_processes(self) -> int:
        """Processes of a local CPU run: one per host, one in all for the single controller,
        plus the Ray driver when disaggregated."""
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
) -> Layout:
    """The layout of `kind` on `hosts` hosts. Under `da`, `split` must give whole host counts
    (`trainer_hosts`)."""
    trainers, per_engine, staleness, transport = hosts, 1, 0, TransportKind.in_process
    match kind:
        case PlacementKind.co:
            pass
        case PlacementKind.single_controller:
            per_engine = hosts
        case PlacementKind.da:
            trainers, staleness = trainer_hosts(split, hosts), max_staleness
            transport = TransportKind.ray
    return Layout(
        kind=kind,
        hosts=hosts,
        devices_per_host=devices_per_host,
        trainer_hosts=trainers,
        rollout_hosts=hosts if trainers == hosts else hosts - trainers,
        hosts_per_engine=per_engine,
        staleness=staleness,
        cpu=cpu,
        transport=transport,
    )


def valid_splits(hosts: int) -> list[float]:
    """Trainer shares of `hosts` that leave whole, non-zero host counts on both sides."""
    return [t / hosts for t in range(1, hosts)]


def show_splits(hosts: int) -> str:
    """The valid splits as a user types them (rounded to 3 decimals: 0.333, not 0.3333...)."""
    shown = ", ".join(f"{v:.3f}".rstrip("0") for v in valid_splits(hosts))
    return shown or "none (placement=da needs at least 2 hosts)"


def whole_trainer_hosts(split: float, hosts: int) -> int | None:
    """Trainer hosts of `split` (as printed, to 3 decimals) on `hosts` hosts; None if the split
    leaves either role no whole, non-zero host count. The one place a split meets hosts."""
    count = round(split * hosts)
    return count if 1 <= count < hosts and abs(count / hosts - split) <= 5e-4 + 1e-12 else None


def trainer_hosts(split: float | None, hosts: int) -> int:
    """placement=da's trainer hosts: `split` of `hosts`, refused (one sentence listing the valid
    splits) unless both roles get whole, non-zero host counts."""
    shown = show_splits(hosts)
    if split is None:
        raise ConfigError(
            f"placement=da needs split=<the trainer's share of hosts>; valid splits for "
            f"{hosts} hosts: {shown}."
        )
    count = whole_trainer_hosts(split, hosts)
    if count is None:
        raise ConfigError(
            f"split={split} with hardware.hosts={hosts} does not give whole, non-zero "
            f"trainer and rollout host counts; valid splits for {hosts} hosts: {shown}."
        )
    return count


def minimal_hosts(kind: PlacementKind, *, split: float | None) -> int:
    """The smallest host count `kind` and `split` need (hardware.hosts=null, CPU only): 1
    colocated, 2 disaggregated without a split, else the first H >= 2 that `split` divides into
    whole host counts."""
    if kind is not PlacementKind.da:
        return 1
    if split is None:
        return 2
    found = next((h for h in range(2, 1025) if whole_trainer_hosts(split, h) is not None), None)
    if found is None:
        raise ConfigError(
            f"split={split} gives no whole trainer host count on up to 1024 hosts; use a share "
            "such as 0.5 (2 hosts), 0.25 (4 hosts) or 0.125 (8 hosts)."
        )
    return found
