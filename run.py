"""Entry point: compose the Hydra config, convert it to the typed `Config`, call `locoexp.main.run`.

    python run.py                                   # the embedded default (tiny model, CPU)
    python run.py model=qwen3_0_6b dataset=gsm8k placement=da split=0.25
    python run.py -m algo=grpo,dr_grpo seed=0,1     # a sweep (Hydra multirun)

This is the only module that imports Hydra. Bad input is reported as one sentence on stderr
with exit code 2 and no traceback, before Hydra creates the run directory.
"""

import dataclasses
import itertools
import sys

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from locoexp.config import Config, config_keys
from locoexp.errors import ConfigError

CONFIG_DIR = "conf"
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


def _hydra_message(error: Exception) -> str:
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
    if "Available options" in str(
        chain[-1]
    ):  # a missing group option: name it and list the valid ones
        head = lines[0].removeprefix("In 'config': ")
        options = lines[
            lines.index(next(x for x in lines if x.startswith("Available options"))) + 1 :
        ]
        options = [o for o in options if not o.startswith(("Config search path", "provider="))]
        return f"{head}; valid options: {', '.join(options)}."
    return " ".join(lines)


def _job_overrides(argv: list[str]) -> list[str]:
    return [
        a
        for a in argv
        if not a.startswith("-")
        and not a.startswith("hydra.")
        and "=" in a
        or (not a.startswith("-") and a.startswith("~"))
    ]


def _sweep_combinations(overrides: list[str]) -> list[list[str]]:
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


def compose_configs(jobs: list[list[str]]) -> list[Config]:
    """The typed config of `python run.py <overrides>` for each job (tests and tools use it)."""
    from pathlib import Path  # noqa: PLC0415

    from hydra import compose, initialize_config_dir  # noqa: PLC0415

    config_dir = str(Path(__file__).resolve().parent / CONFIG_DIR)
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        return [to_config(compose(config_name="config", overrides=list(o))) for o in jobs]


def compose_config(overrides: list[str] = ()) -> Config:
    return compose_configs([list(overrides)])[0]


def preflight(argv: list[str]) -> list[Config]:
    """Compose and validate every job before Hydra starts, so bad input writes nothing."""
    configs = compose_configs(_sweep_combinations(_job_overrides(argv)))
    from locoexp.preflight import check_run  # noqa: PLC0415  (jax loads once the config is valid)

    for config in configs:
        if not config.dry_run:
            check_run(config)
    return configs


@hydra.main(config_path=CONFIG_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from locoexp.main import run  # noqa: PLC0415  (jax loads only once the config is valid)

    hydra_cfg = HydraConfig.get()
    sweep = hydra_cfg.sweep.dir if hydra_cfg.mode.name == "MULTIRUN" else None
    config = to_config(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["hardware"]["chips"] = config.hardware.chips  # derived; W&B groups runs by it
    try:
        # the sweep's date/time directory names the W&B group of a multirun
        run(
            config,
            run_dir=hydra_cfg.runtime.output_dir,
            resolved_config=resolved,
            sweep_name=None if sweep is None else "/".join(sweep.rstrip("/").split("/")[-2:]),
        )
    except ConfigError as error:  # raised after start-up checks that need data (files, vocab)
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def cli() -> None:
    try:
        configs = preflight(sys.argv[1:])
    except (ConfigError, OmegaConfBaseException, hydra.errors.HydraException, ValueError) as error:
        message = str(error) if isinstance(error, ConfigError) else _hydra_message(error)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    if configs and all(c.dry_run for c in configs):  # print the plans; create no run directory
        from locoexp.main import plan  # noqa: PLC0415

        print("\n\n".join(plan(c) for c in configs), flush=True)
        return
    main()


if __name__ == "__main__":
    cli()
