"""Local data files checked before a run loads them: readable, not empty, well-formed JSON and
the columns the task reads. A refusal names the key, the file and the 1-based line.

`datasets` reports a malformed line as a generic `DatasetGenerationError` (the file and row only
in an earlier log line), an empty file as `StopIteration` and a missing column as `KeyError` in
the middle of start-up; this module reads the files itself first, so the user gets one sentence.
CSV and Parquet are checked by their header / schema; a row `datasets` still rejects is reported
by `dataset/load.py`. This module only reads: it must not call `datasets` or write anything.
"""

import csv
import glob
import json
from pathlib import Path

from locoexp.errors import ConfigError, require


def check_data_files(pattern: str, *, key: str, columns: tuple[str, ...]) -> None:
    """Every file matching `pattern` (a path or glob, as `datasets` takes it) holds rows that
    have `columns`; `key` is the config key that named it (dataset.data_files, ...)."""
    files = sorted(Path(f) for f in glob.glob(pattern, recursive=True) if Path(f).is_file())
    require(bool(files), f"dataset.{key}={pattern} matches no readable file.")
    for file in files:
        try:
            _check_file(file, columns)
        except ConfigError as error:
            raise ConfigError(f"dataset.{key}: {file} {error}") from None
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"dataset.{key}: {file} cannot be read ({error}).") from None


def check_held_out_apart(train: str, held_out: str) -> None:
    """No file matches both `dataset.data_files` and `dataset.eval_data_files`: the held-out
    accuracy would score prompts the run trains on."""
    shared = sorted(set(_matches(train)) & set(_matches(held_out)))
    require(
        not shared,
        f"dataset.data_files={train} also matches {shared[0] if shared else ''}, a file of "
        f"dataset.eval_data_files={held_out}: the held-out accuracy would score prompts the run "
        "trains on; narrow the training glob so it leaves the evaluation file out.",
    )


def _matches(pattern: str) -> list[Path]:
    return [Path(f).resolve() for f in glob.glob(pattern, recursive=True) if Path(f).is_file()]


def _check_file(file: Path, columns: tuple[str, ...]) -> None:
    require(file.stat().st_size > 0, "is empty; give a file with at least one row.")
    match file.suffix.lower():
        case ".jsonl":
            _check_json_lines(file.read_bytes(), columns)
        case ".json":
            _check_json(file.read_text(encoding="utf-8"), columns)
        case ".csv":
            with file.open(newline="", encoding="utf-8") as handle:
                header = next(csv.reader(handle), [])
            _require_columns(dict.fromkeys(header), columns, where="line 1 (the header)")
        case ".parquet":
            import pyarrow.parquet  # noqa: PLC0415  (only for parquet files)

            try:
                names = pyarrow.parquet.read_schema(file).names
            except Exception as error:  # noqa: BLE001  (pyarrow raises several types)
                raise ConfigError(f"is not a readable Parquet file ({error}).") from None
            _require_columns(dict.fromkeys(names), columns, where="the schema")


def _check_json_lines(data: bytes, columns: tuple[str, ...]) -> None:
    rows = 0
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ConfigError(
                f"line {number} is not UTF-8 text (byte {error.start + 1} of the line)."
            ) from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"line {number} is not valid JSON ({error.msg} at column {error.colno}); fix or "
                "remove that line."
            ) from None
        _require_columns(row, columns, where=f"line {number}")
        rows += 1
    require(rows > 0, "is empty (only blank lines); give a file with at least one row.")


def _check_json(text: str, columns: tuple[str, ...]) -> None:
    """A .json file is one object (one row), a list of objects, or JSON Lines."""
    require(bool(text.strip()), "is empty (only blank space); give a file with at least one row.")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data":  # several top-level values: JSON Lines
            return _check_json_lines(text.encode("utf-8"), columns)
        raise ConfigError(
            f"line {error.lineno} is not valid JSON ({error.msg} at column {error.colno})."
        ) from None
    rows = value if isinstance(value, list) else [value]
    require(bool(rows), "is an empty JSON list; give a file with at least one row.")
    for index, row in enumerate(rows):
        _require_columns(
            row, columns, where="its object" if rows is not value else f"row {index + 1}"
        )
    return None


def _require_columns(row: object, columns: tuple[str, ...], *, where: str) -> None:
    if not isinstance(row, dict):
        raise ConfigError(f"{where} is not a JSON object of column -> value.")
    missing = [c for c in columns if c not in row]
    if missing:
        raise ConfigError(
            f"{where} has no {', '.join(repr(c) for c in missing)} column (it has "
            f"{', '.join(map(str, row)) or 'none'}); this dataset reads {', '.join(columns)}."
        )
