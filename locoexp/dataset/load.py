"""Rows of a training or held-out split, through `datasets.load_dataset` and nothing else.

Two sources, one call: a hub id (`dataset.path`, `name`, `revision`, split by name), or local
files (`dataset.data_files` / `dataset.eval_data_files`, any format `datasets` reads; the
builder follows the file extension). Local files win: with `data_files` set nothing is fetched,
and the held-out split comes only from `eval_data_files`. `trust_remote_code` is never passed.
A source that cannot be reached becomes one `ConfigError` sentence at start-up: with the Hub's
offline switch (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE) the cache answers at once; without it, a
Hub that does not answer within 2 s is refused before `datasets` would retry it for 30 s.
"""

from pathlib import Path
from typing import Any, Literal, overload

import datasets
import huggingface_hub

from locoexp.dataset.config import DatasetConfig
from locoexp.errors import ConfigError
from locoexp.network import PROBE_TIMEOUT_S, answers

_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".txt": "text",
}
# datasets' JSON reader mis-parses a pretty-printed one-object file (SWE-agent trajectories, one
# row per file) larger than chunksize/32; read each file in one piece.
_JSON_CHUNK_BYTES = 256 << 20


@overload
def load_rows(
    config: DatasetConfig, *, held_out: Literal[False], features: datasets.Features | None = None
) -> datasets.Dataset: ...


@overload
def load_rows(
    config: DatasetConfig, *, held_out: bool, features: datasets.Features | None = None
) -> datasets.Dataset | None: ...


def load_rows(
    config: DatasetConfig, *, held_out: bool, features: datasets.Features | None = None
) -> datasets.Dataset | None:
    """The training rows, or the held-out rows (None when the source has no held-out split; a
    source without a training split is refused). `features` fixes the schema where inferring it
    from the first file can fail (a column that is null throughout one file and text in the
    next)."""
    kwargs: dict[str, Any]
    if config.data_files is not None:
        files = config.eval_data_files if held_out else config.data_files
        if files is None:
            return None
        builder = _builder_for(config.path, files)
        kwargs = {"data_files": files, "split": "train"}
        if builder == "json":
            kwargs["chunksize"] = _JSON_CHUNK_BYTES
    else:
        split = config.eval_split if held_out else config.train_split
        if config.path is None or not split:
            if held_out:
                return None
            raise ConfigError(
                f"dataset={config.kind.value} has no training split: set dataset.data_files to "
                "local files, or dataset.path to a Hub id with a non-empty dataset.train_split "
                f"(dataset.path={config.path}, dataset.train_split={config.train_split!r})."
            )
        builder = config.path
        kwargs = {"name": config.name, "revision": config.revision, "split": split}
        _require_hub(config, held_out)
    if not held_out and config.max_train_rows is not None:
        kwargs["split"] += f"[:{config.max_train_rows}]"
    try:
        return datasets.load_dataset(builder, features=features, **kwargs)
    except ConnectionError as err:
        raise ConfigError(_missing(config, held_out)) from err
    except FileNotFoundError as err:
        if config.data_files is None:
            raise ConfigError(_missing(config, held_out)) from err
        key = "eval_data_files" if held_out else "data_files"
        raise ConfigError(
            f"dataset.{key}={kwargs['data_files']} matches no readable file."
        ) from err
    except (datasets.exceptions.DatasetGenerationError, ValueError, StopIteration) as err:
        raise ConfigError(_unreadable(config, held_out, builder, err)) from None


def _builder_for(path: str | None, files: str) -> str:
    """A packaged builder named in `dataset.path`, else the one for the files' extension."""
    if path in set(_BUILDERS.values()):
        return path
    suffix = Path(files).suffix.lower()
    if suffix not in _BUILDERS:
        raise ConfigError(
            f"dataset.data_files={files} has extension {suffix!r}; name the builder in "
            f"dataset.path (one of {', '.join(sorted(set(_BUILDERS.values())))})."
        )
    return _BUILDERS[suffix]


def _require_hub(config: DatasetConfig, held_out: bool) -> None:
    """Refuse in seconds when the Hub is out of reach (no network) and offline mode is off."""
    endpoint = huggingface_hub.constants.ENDPOINT
    if datasets.config.HF_HUB_OFFLINE or answers(endpoint):
        return
    cache = Path(datasets.config.HF_DATASETS_CACHE) / str(config.path).replace("/", "___")
    cached = (
        f", or rerun with HF_DATASETS_OFFLINE=1 to use the copy cached in {cache}"
        if cache.is_dir()
        else ""
    )
    raise ConfigError(
        f"dataset {config.kind.value}: {_source(config, held_out)} needs the Hugging Face Hub, "
        f"and {endpoint} does not answer from this machine within {PROBE_TIMEOUT_S:g} s; point "
        "dataset.data_files (and dataset.eval_data_files for the held-out split) at local "
        f"files{cached}."
    )


def _unreadable(config: DatasetConfig, held_out: bool, builder: str, error: BaseException) -> str:
    """One sentence for a source `datasets` rejects, with the innermost reason it gave."""
    while error.__cause__ is not None:
        error = error.__cause__
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")
    if config.data_files is None:
        return f"dataset.path={config.path} cannot be read by datasets ({reason})."
    key = "eval_data_files" if held_out else "data_files"
    files = config.eval_data_files if held_out else config.data_files
    return f"dataset.{key}={files} cannot be read by datasets' {builder} reader ({reason})."


def _source(config: DatasetConfig, held_out: bool) -> str:
    split = config.eval_split if held_out else config.train_split
    source = ", ".join(
        f"{key} {value}"
        for key, value in (("config", config.name), ("revision", config.revision), ("split", split))
        if value is not None
    )
    return f"{config.path} ({source})"


def _missing(config: DatasetConfig, held_out: bool) -> str:
    return (
        f"dataset {config.kind.value} is missing: {_source(config, held_out)} cannot be loaded "
        "from the Hugging Face Hub or its cache; point dataset.data_files (and "
        "dataset.eval_data_files for the held-out split) at local files."
    )
