"""How each placement maps onto the hardware: processes, devices, who trains and who generates,
and how stale the rollouts are. The enum is the registry; `build_layout` is its one builder.

- `co` (LoCoJAX-CO): one process per host; every host trains (FSDP over all devices) and
  generates on its own devices with its own engine; staleness 0.
- `single_controller` (the baseline, Pathways-style): one process holding every host's devices;
  it admits every request itself and its engine is one lockstep program over all devices;
  staleness 0. The same halves and loop as `co`, in one process.
- `da` (LoCoJAX-DA): one Ray actor per host; split x H hosts train as their own
  `jax.distributed` group, the others generate one step stale (staleness 1).
"""

import dataclasses

from locoexp.placement.config import PlacementKind


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layout:
    processes: int  # processes the launcher starts (da: none; Ray starts the actors)
    devices_per_process: int
    trainer_hosts: int
    rollout_hosts: int
    hosts_per_engine: int  # 1: host-local engines; H: one lockstep engine over every host
    staleness: int  # steps between the weights that sample a batch and the update it feeds


def build_layout(
    kind: PlacementKind, *, hosts: int, devices_per_host: int, split: float | None
) -> Layout:
    match kind:
        case PlacementKind.co:
            return Layout(
                processes=hosts,
                devices_per_process=devices_per_host,
                trainer_hosts=hosts,
                rollout_hosts=hosts,
                hosts_per_engine=1,
                staleness=0,
            )
        case PlacementKind.single_controller:
            return Layout(
                processes=1,
                devices_per_process=hosts * devices_per_host,
                trainer_hosts=hosts,
                rollout_hosts=hosts,
                hosts_per_engine=hosts,
                staleness=0,
            )
        case PlacementKind.da:
            trainer_hosts = round((split or 0) * hosts)
            return Layout(
                processes=0,
                devices_per_process=devices_per_host,
                trainer_hosts=trainer_hosts,
                rollout_hosts=hosts - trainer_hosts,
                hosts_per_engine=1,
                staleness=1,
            )
