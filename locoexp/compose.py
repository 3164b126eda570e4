"""Config composition: Hydra YAML (`conf/`) -> the typed root `Config`, for `run.py`, tools and
tests alike. With `run.py` it is the only module that imports Hydra.

It registers the schema (`config_schema`) in Hydra's ConfigStore, refuses keys the schema does
not have (a typo is an error, never dropped), checks every job of a multirun before any starts,
and turns Hydra's errors into one sentence. It never starts a run; jax loads only in
`preflight`, once the config is valid.
"""

import dataclasses
import itertools
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.conf import HydraConf
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from locoexp.config import Config, config_keys
from locoexp.errors import ConfigError
from locoexp.hardware.config import ChipKind

CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf"
# `+experiment=<name>` files; conf/config.yaml names them relative to the working directory
# (run.py runs from the repository root), composition here from anywhere
EXPERIMENT_DIR = CONFIG_DIR.parent / "experiments"
EXPERIMENTS = f"hydra.searchpath=[file://{EXPERIMENT_DIR}]"
ConfigStore.instance().store(name="config_schema", node=Config)
# Keys a group's option owns: a preset is named for them (a TPU slice's memory, hosts and device
# count describe its chip), so a command line that sets one apart from the preset's own value
# contradicts the preset and is refused rather than planned as a chimera.
PRESET_KEYS = {"hardware": ("chip",)}


def to_config(cfg: DictConfig) -> Config:
    """The typed config; a key the schema does not have (e.g. `+typo=1`) is refused, not dropped."""
    _refuse_unknown_keys(cfg, Config, prefix="")
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, Config), "a DictConfig of the Config schema converts to a Config"
    return config


def _refuse_unknown_keys(node: DictConfig, schema: type[Any], *, prefix: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in map(str, node):
        if key == "hydra":
            continue
        if key not in fields:
            raise ConfigError(
                f"'{prefix}{key}' is not a config key; the valid keys of "
                f"{prefix.rstrip('.') or 'the root'} are {', '.join(sorted(fields))}."
            )
        child_type = fields[key].type
        if (
            isinstance(child_type, type)
            and dataclasses.is_dataclass(child_type)
            and isinstance(node[key], DictConfig)
        ):
            _refuse_unknown_keys(node[key], child_type, prefix=f"{prefix}{key}.")


def compose_configs(jobs: list[list[str]]) -> list[Config]:
    """The typed config of `python run.py <overrides>` for each job; of several jobs, a refusal
    names the job's overrides."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return [_compose_job(o, named=len(jobs) > 1) for o in jobs]


def _compose_job(overrides: list[str], *, named: bool) -> Config:
    try:
        cfg = compose(
            config_name="config", overrides=[*overrides, EXPERIMENTS], return_hydra_config=True
        )
        choices = dict(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]
        _refuse_preset_contradictions(cfg, choices)
        return to_config(cfg)
    except (ConfigError, OmegaConfBaseException, HydraException, ValueError) as error:
        message = str(error) if isinstance(error, ConfigError) else hydra_message(error)
        if not named and isinstance(error, ConfigError):
            raise
        job = f"job {' '.join(overrides)}: " if named else ""
        raise ConfigError(job + message) from error


def _refuse_preset_contradictions(cfg: DictConfig, choices: dict[str, str]) -> None:
    """A `PRESET_KEYS` key set (on the command line or in an experiment) apart from the value
    of the option chosen for its group, e.g. `hardware=tpu_v7x_8 hardware.chip=cpu`."""
    for group, keys in PRESET_KEYS.items():
        option = choices.get(group)
        files = [CONFIG_DIR / group / f"{option}.yaml", EXPERIMENT_DIR / group / f"{option}.yaml"]
        preset = next((_load_option(f) for f in files if f.is_file()), DictConfig({}))
        for key in keys:
            own, value = preset.get(key), cfg[group].get(key)
            value = getattr(value, "value", value)  # an enum key's member -> its yaml value
            if own is not None and str(value) != str(own):
                raise ConfigError(
                    f"{group}.{key}={value} contradicts {group}={option}, whose {key} is {own}; "
                    f"drop {group}.{key}=, or choose a {group} option made for {value} (one of "
                    f"{', '.join(_options_with(group, key, value))})."
                )


def _options_with(group: str, key: str, value: object) -> list[str]:
    """The options of `group` whose `key` is `value`."""
    folders = (CONFIG_DIR / group, EXPERIMENT_DIR / group)
    files = sorted(f for folder in folders for f in folder.glob("*.yaml"))
    return [f"{group}={f.stem}" for f in files if str(_load_option(f).get(key)) == str(value)]


def _load_option(path: Path) -> DictConfig:
    option = OmegaConf.load(path)
    if not isinstance(option, DictConfig):
        raise ConfigError(f"{path} holds a list; a config option is a mapping of keys to values.")
    return option


def compose_config(overrides: Sequence[str] = ()) -> Config:
    """The typed config of `python run.py <overrides>` (tests and tools use it)."""
    return compose_configs([list(overrides)])[0]


def hydra_message(error: Exception) -> str:
    """Hydra/OmegaConf errors -> one sentence naming the key and what is valid."""
    chain: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in chain:  # raised from, or while handling, another
        chain.append(link)
        link = link.__cause__ or link.__context__
    # a key inside an experiment (or other) file: Hydra's "In 'experiment/x': ..." names it
    where = str(chain[0]).partition("': ")[0] + "': " if str(chain[0]).startswith("In '") else ""
    for cause in chain:
        if isinstance(cause, OverrideParseException):  # its own cause is antlr's, text 'None'
            return (
                f"the override {cause.override!r} does not parse "
                f"({cause.message.splitlines()[0]}): quote a value holding braces, brackets, "
                f"commas, spaces or '=' (key='value', the whole override in shell quotes)."
            )
        key: str | None = getattr(cause, "full_key", None)
        if isinstance(cause, OmegaConfBaseException) and key:
            what = str(cause).splitlines()[0]
            if "not in" in what or "not in struct" in what:
                parent = key.rpartition(".")[0]
                keys = hydra_keys(parent) if key.startswith("hydra.") else config_keys(parent)
                return (
                    f"{where}'{key}' is not a config key; the valid keys of "
                    f"{parent or 'the root'} are {', '.join(keys)}."
                )
            return f"{where}{key}: {what.rstrip('.')}."
    lines = [line.strip() for line in str(chain[-1]).splitlines() if line.strip()]
    if "Available options" in str(chain[-1]):  # a missing group option: name the valid ones
        head = lines[0].removeprefix("In 'config': ")
        first = lines.index(next(x for x in lines if x.startswith("Available options")))
        options = [
            o for o in lines[first + 1 :] if not o.startswith(("Config search path", "provider="))
        ]
        return f"{head}; valid options: {', '.join(options)}."
    return " ".join(lines)


def hydra_keys(path: str) -> list[str]:
    """The keys under `path` of Hydra's own config ("hydra", "hydra.run", ...)."""
    node: type[Any] = HydraConf
    for part in path.split(".")[1:]:
        field_type = {f.name: f.type for f in dataclasses.fields(node)}.get(part)
        if not (isinstance(field_type, type) and dataclasses.is_dataclass(field_type)):
            return []
        node = field_type
    return sorted(f.name for f in dataclasses.fields(node))


def check_hydra_overrides(argv: list[str]) -> None:
    """The command line's `hydra.*` overrides parse and name keys of Hydra's config: Hydra
    itself would report either with its parser's or OmegaConf's raw text and a traceback
    hint. Raises what `hydra_message` turns into one sentence."""
    overrides = [a for a in argv if a.startswith("hydra.")]
    if not overrides:
        return
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        compose(config_name="config", overrides=[*overrides, EXPERIMENTS], return_hydra_config=True)


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
    """Every job of a multirun, as plain overrides, in the order Hydra's basic sweeper runs
    them: one choice list per key (a key given twice keeps the later value at the earlier
    position), their product with the first key outermost, so each can be checked before any
    runs. `glob(...)` over a group lists its options in conf/ and experiments/."""
    choices: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides(overrides):
        key, value = o.get_key_element(), o.value()
        if not o.is_sweep_override():
            values = [o.get_value_element_as_str()]
        elif isinstance(value, Glob):
            values = value.filter(group_options(key.lstrip("+~")))
        else:
            values = list(o.sweep_string_iterator())
        choices[key] = [f"{key}={v}" for v in values]
    return [list(c) for c in itertools.product(*choices.values())]


def group_options(group: str) -> list[str]:
    """The options of a config group, from conf/ and experiments/ (Hydra's search path)."""
    folders = (CONFIG_DIR / group, EXPERIMENT_DIR / group)
    return sorted({f.stem for folder in folders for f in folder.glob("*.yaml")})


def experiment_sweep(overrides: list[str]) -> list[str]:
    """An experiment file's `hydra.sweeper.params` as overrides (Hydra's basic sweeper puts them
    before the command line's), read from the config the command line composes without its
    sweeps (as Hydra composes the multirun's own config)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    fixed = [o for o, p in zip(overrides, parsed, strict=True) if not p.is_sweep_override()]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=[*fixed, EXPERIMENTS], return_hydra_config=True
        )
    params = cfg.hydra.sweeper.get("params") or {}
    return [f"{key}={value}" for key, value in params.items()]


def sweep_jobs(argv: list[str]) -> list[list[str]]:
    """The jobs of a command line: one, or under `-m` every job of its sweep together with the
    experiment file's."""
    overrides = job_overrides(argv)
    if not {"-m", "--multirun"} & set(argv):
        return [overrides]
    return sweep_combinations([*experiment_sweep(overrides), *overrides])


# Overrides that repeat a cell (launches, seeds) or select the file, not part of its name.
REPEATS = ("launch=", "seed=", "+experiment=", "dry_run=")


def cell_of(job: list[str]) -> str:
    """A job's cell (one of an experiment file's, `sweep_jobs`): its overrides' values,
    repeats (launch, seed) left out."""
    return " ".join(o.split("=", 1)[1] for o in job if not o.startswith(REPEATS))


def override_value(value: str) -> str:
    """`value` written so that Hydra's override parser reads it back unchanged: as it is where
    that holds, else in single quotes with quotes, the backslashes before them and `${`
    escaped (a directory named with `;`, `,`, `=`, quotes or brackets)."""
    plain = "${" not in value and "\\" not in value
    try:
        parsed = OverridesParser.create().parse_override(f"key={value}")
    except HydraException:  # the parser's own, or its lexer's
        plain = False
    else:
        plain = plain and not parsed.is_sweep_override() and parsed.value() == value
    if plain:
        return value
    body = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value)
    return "'" + body.replace("'", "\\'").replace("${", "\\${") + "'"


def run_directories(argv: list[str], count: int) -> list[Path]:
    """Each job's run directory as Hydra will name it: `hydra.run.dir`, or under `-m`
    `hydra.sweep.dir/<job number>`, given on the command line or conf/config.yaml's dated
    defaults (relative to the working directory, as Hydra makes them with `job.chdir: false`)."""
    multirun = bool({"-m", "--multirun"} & set(argv))
    key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
    parser = OverridesParser.create()
    given = [str(parser.parse_override(a).value()) for a in argv if a.startswith(key)]
    dated = time.strftime("%Y-%m-%d/%H-%M-%S")
    base = Path(given[-1] if given else f"{'multirun' if multirun else 'outputs'}/{dated}")
    return [base / str(number) for number in range(count)] if multirun else [base]


def use_cpu_backend() -> None:
    """Runs on CPU and dry runs use JAX's CPU backend alone: with libtpu installed (the test
    extra) JAX would otherwise try a TPU first and libtpu print its accelerator warnings. Set
    in the environment before jax loads, so the local hosts and Ray actors inherit it."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if "jax" in sys.modules:
        sys.modules["jax"].config.update("jax_platforms", os.environ["JAX_PLATFORMS"])


def compose_command_line(argv: list[str]) -> list[tuple[list[str], Config]]:
    """Compose every job of a command line before Hydra starts (an experiment file's sweep
    included), so bad input writes nothing: the schema's checks, with JAX's CPU backend chosen
    where every job runs on CPU or only plans. Returns (overrides, config) per job; what needs
    the machine is `locoexp.preflight.check_jobs`' (which loads jax: run it once these hold)."""
    check_hydra_overrides(argv)
    jobs = sweep_jobs(argv)
    configs = compose_configs(jobs)
    if all(c.hardware.chip is ChipKind.cpu or c.dry_run for c in configs):
        use_cpu_backend()
    return list(zip(jobs, configs, strict=True))
