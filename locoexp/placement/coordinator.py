"""`CoordinatorSpec`: where a run's processes meet, what only the code that starts or joins them
reads (`locoexp.main`'s launch, the Ray session and its trainer group, the start-up check of
the listening address). Frozen, jax-free and Ray-free, so a `RunSpec` holds it; built from the
`hardware` group by `locoexp.session.build`. Who runs where is the layout's
(`locoexp.layout.Layout`), not here.
"""

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoordinatorSpec:
    # hardware.coordinator_port: the jax.distributed coordinator's port (0: a free port)
    port: int = 0
    # the interface every listening socket binds to (hardware.bind_address; None: all, as on a
    # TPU slice; loopback for a run on this machine alone)
    bind_address: str | None = None
    # hosts a cluster starts (hardware.coordinator_address, hardware.process_id): host 0's
    # address:port and this process's host index (None: the local launcher starts every host,
    # or a TPU slice's environment names both)
    address: str | None = None
    process_id: int | None = None
    timeout_s: int = 300  # hardware.coordinator_timeout_s: how long the group may take to meet

    @property
    def cluster_started(self) -> bool:
        """This process is one host of a group a cluster started (it names its own index)."""
        return self.process_id is not None
