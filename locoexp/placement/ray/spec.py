"""`RaySpec`: the Ray cluster of a `placement=da` run, what only the Ray transport reads (its
session, its actors, its restarts). Frozen, jax-free and Ray-free, so a `RunSpec` holds it;
built from the `placement` group by `locoexp.session.build`, absent (None) where the layout is
colocated and no Ray runs.
"""

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class RaySpec:
    address: str | None = None  # placement.ray_address: a cluster to join (None: a local one)
    # placement.rollout_restarts: how often Ray restarts each rollout host whose process died
    rollout_restarts: int = 0
    # placement.rollout_restart_timeout_s: the driver's wait for one restart
    rollout_restart_timeout_s: float = 600.0
    # a local cluster's object store (planner.plan.object_store_bytes; None: Ray's default)
    object_store_bytes: int | None = None

    @property
    def joined(self) -> bool:
        """The driver joins a cluster that spans machines (`placement.ray_address`)."""
        return self.address is not None
