"""The exception types a run reports as one sentence, without a traceback.

A `ConfigError` carries one sentence that names the key, the value and what would be valid; a
`RunFailed` one that says what of a running job was lost and how to resume it; `unwritable` the
`ConfigError` of a file the run could not write (a full disk), naming what was kept. `run.py`
prints them and exits non-zero; nothing else catches them.
"""


class ConfigError(ValueError):
    """Bad configuration or input, reported to the user as one sentence."""


def unwritable(path: object, error: Exception, *, kept: str) -> ConfigError:
    """The sentence for a file of the run that could not be written (a full disk, a file system
    gone read-only): `path`, why (`error`), what is intact (`kept`), and how to go on. The run
    ends with it; resuming redoes only what its last checkpoint does not hold."""
    reason = getattr(error, "strerror", None) or str(error).splitlines()[0]
    return ConfigError(
        f"{path} could not be written ({reason}); {kept}: free space or move the run directory, "
        "then rerun the same command to resume from its last checkpoint."
    )


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
