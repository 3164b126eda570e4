"""Schema of the `logger` config group. A metrics.jsonl file is always written besides.

`kind=wandb` writes a W&B run under the run directory: online when `mode=online`, or when `mode`
is null and W&B credentials are configured on this machine; offline otherwise, so a user without
an account still gets a run to `wandb sync` later.
"""

import dataclasses
import enum

from locoexp.errors import require


class LoggerKind(enum.Enum):
    none = "none"
    wandb = "wandb"


class WandbMode(enum.Enum):
    online = "online"
    offline = "offline"


@dataclasses.dataclass(kw_only=True)
class LoggerConfig:
    kind: LoggerKind = (
        LoggerKind.wandb
    )  # the embedded default logs to W&B (offline without an account)
    project: str = "locoexp"
    entity: str | None = None  # None: the W&B account's default entity
    group: str | None = None  # None: the Hydra multirun sweep, or the run's own name
    job_type: str = "train"
    tags: list[str] = dataclasses.field(default_factory=list)
    # None: online when W&B credentials are configured, offline otherwise.
    mode: WandbMode | None = None
    # When online is asked for (mode=online or WANDB_MODE=online) but cannot work here (no
    # credentials, or the W&B server does not answer within 2 s): false = refuse at start-up with
    # the fix; true = log offline instead, with a printed notice (`wandb sync` uploads it later).
    offline_fallback: bool = False

    def __post_init__(self):
        require(
            self.project.strip() != "",
            f"logger.project={self.project!r} is invalid: it must name a W&B project.",
        )
        require(
            self.job_type.strip() != "",
            f"logger.job_type={self.job_type!r} is invalid: it must be a word such as 'train'.",
        )
        require(
            all(0 < len(tag) <= 64 for tag in self.tags),
            f"logger.tags={self.tags} is invalid: W&B tags are 1 to 64 characters long.",
        )
