"""Schema of the `logger` config group. A metrics.jsonl file is always written besides."""

import dataclasses
import enum


class LoggerKind(enum.Enum):
    none = "none"
    wandb = "wandb"


@dataclasses.dataclass(kw_only=True)
class LoggerConfig:
    kind: LoggerKind = LoggerKind.none
    project: str = "locoexp"
    entity: str | None = None
    group: str | None = None  # None: the Hydra multirun sweep, or the run's own name
    job_type: str = "train"
    tags: list[str] = dataclasses.field(default_factory=list)
    # None: online when W&B credentials are configured, offline otherwise.
    mode: str | None = None
