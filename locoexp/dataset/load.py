"""Rows of a training or held-out split, through `datasets.load_dataset` and nothing else.

Two sources, one call: a hub id (`dataset.path`, `name`, `revision`, split by name), or local
files (`dataset.data_files` / `dataset.eval_data_files`, any format `datasets` reads; the
builder follows the file extension). Local files win: with `data_files` set nothing is fetched,
and the held-out split comes only from `eval_data_files`. `trust_remote_code` is never passed.
A source that cannot be reached becomes one `ConfigError` sentence at start-up.
"""

from pathlib import Path

import datasets

from locoexp.dataset.config import DatasetConfig
from locoexp.errors import ConfigError

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


def load_rows(
    config: DatasetConfig, *, held_out: bool, features: datasets.Features | None = None
) -> datasets.Dataset | None:
    """The training rows, or the held-out rows (None when the source has no held-out split).
    `features` fixes the schema where inferring it from the first file can fail (a column that
    is null throughout one file and text in the next)."""
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
            return None
        builder = config.path
        kwargs = {"name": config.name, "revision": config.revision, "split": split}
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


def _missing(config: DatasetConfig, held_out: bool) -> str:
    split = config.eval_split if held_out else config.train_split
    source = ", ".join(
        f"{key} {value}"
        for key, value in (("config", config.name), ("revision", config.revision), ("split", split))
        if value is not None
    )
    return (
        f"dataset {config.kind.value} is missing: {config.path} ({source}) cannot be loaded from "
        f"the Hugging Face Hub or its cache; point dataset.data_files (and "
        f"dataset.eval_data_files for the held-out split) at local files."
    )
