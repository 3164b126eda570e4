"""Config composition: Hydra YAML (`conf/`) -> the typed root `Config`, for `run.py`, tools and
tests alike. With `run.py` it is the only module that imports Hydra.

It registers the schema (`config_schema`) in Hydra's ConfigStore, refuses keys the schema does
not have (a typo is an error, never dropped), checks every job of a multirun before any starts,
and turns Hydra's errors into one sentence. It never starts a run; jax loads only in
`preflight`, once the config is valid.
"""

import dataclasses
import itertools
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from locoexp.config import Config, config_keys
from locoexp.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf"
# `+experiment=<name>` files; conf/config.yaml names them relative to the working directory
# (run.py runs from the repository root), composition here from anywhere
EXPERIMENTS = f"hydra.searchpath=[file://{CONFIG_DIR.parent / 'experiments'}]"
ConfigStore.instance().store(name="config_schema", node=Config)


def to_config(cfg: DictConfig) -> Config:
    """The typed config; a key the schema does not have (e.g. `+typo=1`) is refused, not dropped."""
    _refuse_unknown_keys(cfg, Config, prefix="")
    return OmegaConf.to_object(cfg)


def _refuse_unknown_keys(node: DictConfig, schema: type, *, prefix: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node:
        if key == "hydra":
            continue
        if key not in fields:
            raise ConfigError(
                f"'{prefix}{key}' is not a config key; the valid keys of "
                f"{prefix.rstrip('.') or 'the root'} are {', '.join(sorted(fields))}."
            )
        child_type = fields[key].type
        if dataclasses.is_dataclass(child_type) and isinstance(node[key], DictConfig):
            _refuse_unknown_keys(node[key], child_type, prefix=f"{prefix}{key}.")


def compose_configs(jobs: list[list[str]]) -> list[Config]:
    """The typed config of `python run.py <overrides>` for each job."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return [to_config(compose(config_name="config", overrides=[*o, EXPERIMENTS])) for o in jobs]


def compose_config(overrides: list[str] = ()) -> Config:
    """The typed config of `python run.py <overrides>` (tests and tools use it)."""
    return compose_configs([list(overrides)])[0]


def hydra_message(error: Exception) -> str:
    """Hydra/OmegaConf errors -> one sentence naming the key and what is valid."""
    chain = []
    while error is not None:
        chain.append(error)
        error = error.__cause__
    for cause in chain:
        if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
            key, what = cause.full_key, str(cause).splitlines()[0]
            if "not in" in what or "not in struct" in what:
                parent = key.rpartition(".")[0]
                return (
                    f"'{key}' is not a config key; the valid keys of {parent or 'the root'} are "
                    f"{', '.join(config_keys(parent))}."
                )
            return f"{key}: {what.rstrip('.')}."
    lines = [line.strip() for line in str(chain[-1]).splitlines() if line.strip()]
    if "Available options" in str(chain[-1]):  # a missing group option: name the valid ones
        head = lines[0].removeprefix("In 'config': ")
        first = lines.index(next(x for x in lines if x.startswith("Available options")))
        options = [
            o for o in lines[first + 1 :] if not o.startswith(("Config search path", "provider="))
        ]
        return f"{head}; valid options: {', '.join(options)}."
    return " ".join(lines)


def job_overrides(argv: list[str]) -> list[str]:
    """The config overrides of a command line (Hydra's own flags and `hydra.*` left out)."""
    return [
        a
        for a in argv
        if not a.startswith("-")
        and not a.startswith("hydra.")
        and "=" in a
        or (not a.startswith("-") and a.startswith("~"))
    ]


def sweep_combinations(overrides: list[str]) -> list[list[str]]:
    """Every job of a multirun, as plain overrides, so each can be checked before any runs."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = []
    for o in parsed:
        key = o.get_key_element()
        values = (
            list(o.sweep_string_iterator())
            if o.is_sweep_override()
            else [o.get_value_element_as_str()]
        )
        choices.append([f"{key}={v}" for v in values])
    return [list(c) for c in itertools.product(*choices)]


def preflight(argv: list[str]) -> list[Config]:
    """Compose and validate every job of a command line before Hydra starts, so bad input
    writes nothing: the schema's checks, then `locoexp.preflight.check_run` (files, engine,
    logger)."""
    configs = compose_configs(sweep_combinations(job_overrides(argv)))
    from locoexp.preflight import check_run  # noqa: PLC0415  (jax loads once the config is valid)

    for config in configs:
        if not config.dry_run:
            check_run(config)
    return configs
