"""The one exception type for bad user input.

A `ConfigError` carries one sentence that names the key, the value and what would be valid.
`run.py` prints it without a traceback and exits non-zero; nothing else catches it.
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
