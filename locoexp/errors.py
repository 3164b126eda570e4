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
