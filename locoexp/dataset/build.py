"""`build_task`: the one place a `DatasetKind` becomes a `Task` (the enum is the registry)."""

from locoexp.dataset.config import DatasetConfig, DatasetKind
from locoexp.dataset.synthetic import ReverseDigitsTask
from locoexp.dataset.task import Task


def build_task(config: DatasetConfig) -> Task:
    """Load, render and tokenize the prompts of `config` (once, at start-up)."""
    match config.kind:
        case DatasetKind.synthetic:
            return ReverseDigitsTask(config.synthetic, seed=config.seed)
        case _:
            raise NotImplementedError(f"dataset.kind={config.kind.value} is not built yet")
