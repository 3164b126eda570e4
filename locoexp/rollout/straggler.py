"""Stragglers made on purpose (`rollout.straggler`): each step one rollout host is slowed, as
the paper simulated Eq. 4's A ("the straggler wait that staleness absorbs", App. C; Section 4.4:
the slowest rollout host falls 38% to 55% of the step behind the average at 128 chips).

The slowed host is the same every step (`host`) or drawn each step from the run's seed, so every
host process agrees on it without talking. Its generation takes `factor` times as long plus
`delay_s` seconds, spent sleeping after its real generation: the host is late, not busy, as a
host whose rows ran longer would be. Real variance counts too (EOS sampling gives the hosts
different generation lengths); this only adds a controlled part on top. Jax-free: the step
settings hold the config and `halves.RolloutHalf` calls `injected_delay_s`.
"""

import dataclasses
import time

import numpy as np

from locoexp.errors import require


@dataclasses.dataclass(kw_only=True)
class StragglerConfig:
    delay_s: float = 0.0  # seconds added to the slowed host's generation (0 = off)
    factor: float = 1.0  # the slowed host's generation time multiplied by this (1 = off)
    host: int | None = None  # always this rollout host; null = a seeded draw each step

    def __post_init__(self):
        require(
            self.delay_s >= 0,
            f"rollout.straggler.delay_s={self.delay_s} must be >= 0 (0 = no added delay).",
        )
        require(
            self.factor >= 1,
            f"rollout.straggler.factor={self.factor} must be >= 1 (1 = no slow-down).",
        )
        require(
            self.host is None or self.host >= 0,
            f"rollout.straggler.host={self.host} must be a rollout host index >= 0 or null.",
        )

    @property
    def active(self) -> bool:
        return self.delay_s > 0 or self.factor > 1


def slowed_host(config: StragglerConfig, *, step: int, hosts: int, seed: int) -> int:
    """The rollout host slowed at `step`: `config.host`, or a draw seeded by (seed, step)."""
    if config.host is not None:
        return config.host
    return int(np.random.default_rng([seed, step]).integers(hosts))


def injected_delay_s(
    config: StragglerConfig, *, step: int, host: int, hosts: int, seed: int, generation_s: float
) -> float:
    """Sleep the delay that rollout host `host` of `hosts` is given at `step` (after its real
    generation of `generation_s` seconds); returns it (0 on every other host)."""
    if not config.active or slowed_host(config, step=step, hosts=hosts, seed=seed) != host:
        return 0.0
    delay = config.delay_s + (config.factor - 1) * generation_s
    time.sleep(delay)
    return delay
