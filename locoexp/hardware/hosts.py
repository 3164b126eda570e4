"""Host-count arithmetic of a `da` split: which trainer shares a host count allows, how many
trainer hosts a share gives, and the smallest host count a run needs (`hardware.hosts: null`).

Plain integers only: the root config checks, the planner and the run readers (`metrics`,
`analysis`, which never import the root `Config`) share these definitions.
"""

from locoexp.errors import ConfigError


def valid_splits(hosts: int) -> list[float]:
    """Trainer shares of `hosts` that leave whole, non-zero host counts on both sides."""
    return [t / hosts for t in range(1, hosts)]


def show_splits(hosts: int) -> str:
    """The valid splits as a user types them (rounded to 3 decimals: 0.333, not 0.3333...)."""
    shown = ", ".join(f"{v:.3f}".rstrip("0") for v in valid_splits(hosts))
    return shown or "none (placement=da needs at least 2 hosts)"


def trainer_hosts(split: float, hosts: int) -> int | None:
    """Trainer hosts of `split` (as printed, to 3 decimals) on `hosts` hosts; None if invalid."""
    count = round(split * hosts)
    return count if 1 <= count < hosts and abs(count / hosts - split) <= 5e-4 + 1e-12 else None


def minimal_hosts(*, disaggregated: bool, split: float | None) -> int:
    """The smallest host count a placement and `split` need (hardware.hosts=null, CPU only):
    1 colocated, 2 disaggregated without a split, else the first H >= 2 that `split` divides
    into whole host counts."""
    if not disaggregated or split is None:
        return 2 if disaggregated else 1
    found = next((h for h in range(2, 1025) if trainer_hosts(split, h) is not None), None)
    if found is None:
        raise ConfigError(
            f"split={split} gives no whole trainer host count on up to 1024 hosts; use a share "
            "such as 0.5 (2 hosts), 0.25 (4 hosts) or 0.125 (8 hosts)."
        )
    return found
