"""The exception types a run reports as one sentence, without a traceback.

A `ConfigError` carries one sentence that names the key, the value and what would be valid; a
`RunFailed` one that says what of a running job was lost and how to resume it. `run.py` prints
them and exits non-zero; nothing else catches them.
"""


class ConfigError(ValueError):
    """Bad configuration or input, reported to the user as one sentence."""


def require(condition: bool, message: str) -> None:
    """Raise `ConfigError(message)` unless `condition` holds."""
    if not condition:
        raise ConfigError(message)


class TrainingDiverged(ConfigError):
    """A step's loss or gradient is no longer a finite number. Reported like bad input (one
    sentence, exit 2, no traceback): the fix is a config change (a smaller learning rate)."""


class RunFailed(Exception):
    """A part of the run that cannot be replaced died (a `placement=da` trainer host, or a rollout
    host past its restart budget): one sentence naming what died and how to resume; `run.py`
    appends the command that resumes from the last checkpoint."""
