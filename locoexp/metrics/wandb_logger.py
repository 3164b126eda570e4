"""Where per-step metrics go besides metrics.jsonl: a W&B run, or nowhere (`logger=none`).

`build_logger` dispatches on `LoggerConfig.kind`. The W&B run lives under the run directory
(`<run_dir>/wandb/`), carries the resolved config, and plots every key against the global step
(`step`, declared with `define_metric`), so records logged out of order or after a restart still
land on the right x. Its id is kept in `<run_dir>/wandb_run_id`: a restarted run (same run_dir)
resumes the same W&B run (`resume="allow"`) instead of starting a duplicate, and continues its
step axis: W&B history rows cannot be removed, so the steps the lost attempt already logged (after
the checkpoint the run resumes from) are not logged again (`logged_through_step`). Those rows keep
the lost attempt's values: the same losses and rewards under deterministic continuation, but that
attempt's timings; metrics.jsonl holds the resumed attempt's.

Mode: `logger.mode` when set; else `WANDB_MODE` from the environment when set; else online when W&B
credentials are configured (WANDB_API_KEY, an identity token file, or a netrc entry for the W&B
host: files and environment only, no network), offline otherwise, so a user without an account
still gets a run directory to `wandb sync` later.

`checked_mode` adds what online needs before the run directory exists (`locoexp.preflight` calls
it): credentials found locally and a W&B server that answers within 2 s. Asked-for online that
cannot work is refused with the fix, or falls back to offline with a printed notice when
`logger.offline_fallback` is set; an automatic online (credentials found) falls back with a notice.

This module must not write metrics.jsonl (the step engine does), and must be built on one
process only (the first host): W&B runs are per job, not per host.
"""

import contextlib
import dataclasses
import enum
import functools
import logging
import netrc
import os
import secrets
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from locoexp.errors import ConfigError, unwritable
from locoexp.metrics.config import LoggerConfig, LoggerKind, WandbMode
from locoexp.network import PROBE_TIMEOUT_S, answers

RUN_ID_FILE = "wandb_run_id"
WANDB_DIR = "wandb"  # W&B's own files, under the run directory
# What a W&B run's files take before its first steps (metadata, logs, the config, a first
# history chunk; about 100 KiB for the tiny model), with room to spare
WANDB_ROOM_BYTES = 2**20
STEP_KEY = "step"  # the x axis of every panel: the global step, as in metrics.jsonl
DEFAULT_WANDB_HOST = "https://api.wandb.ai"  # also W&B's upstream for its default Forge host
# W&B's environment variables (`wandb.env`), named here so that a run with `logger=none`, every
# host process and every Ray actor start without importing wandb (about 1 s each)
MODE_ENV, API_KEY_ENV, BASE_URL_ENV = "WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"
IDENTITY_TOKEN_FILE_ENV = "WANDB_IDENTITY_TOKEN_FILE"

if TYPE_CHECKING:
    import wandb


class NullLogger:
    """`logger=none`: every call does nothing; metrics.jsonl remains the record."""

    def log(self, record: dict[str, Any], step: int) -> None:
        pass

    def summary(self, values: dict[str, Any]) -> None:
        pass

    def finish(self, *, failed: bool = False) -> None:
        pass


class WandbLogger:
    """One W&B run; `log` writes a history row at global step `step`."""

    def __init__(self, run: "wandb.Run", *, logged_through_step: int | None = None):
        self.run = run
        run.define_metric(STEP_KEY)
        run.define_metric("*", step_metric=STEP_KEY)
        self._finished = False
        # a resumed run: steps up to here are already in the W&B history (module docstring)
        self.logged_through_step = -1 if logged_through_step is None else logged_through_step

    @property
    def run_id(self) -> str:
        return self.run.id

    def log(self, record: dict[str, Any], step: int) -> None:
        # No `step=` argument: W&B's own `_step` must stay monotonic across a resumed run, and
        # eval records share their step with the step record; the x axis is the `step` key.
        if step > self.logged_through_step:
            self.run.log({**record, STEP_KEY: int(step)})

    def summary(self, values: dict[str, Any]) -> None:
        self.run.summary.update(values)

    def finish(self, *, failed: bool = False) -> None:
        """Finish the run and return once its records are in `<run_dir>/wandb/`: `run.finish`
        waits for the exit record, but closing the run's file is only requested of the
        wandb-core service (`inform_finish`, not awaited), and until then the file may hold
        none of the run's history (seen: a 7-byte file right after `finish`, every row a
        second later). `wandb.teardown` stops the service, which closes every run's file. `failed`:
        the run is ending with an error of its own; W&B's own errors are not raised over it."""
        if self._finished:
            return
        self._finished = True
        import wandb  # noqa: PLC0415  (imported already: this run is a wandb.Run)

        if not failed:
            self.run.finish()
            wandb.teardown()
            return
        # The run ends with its own sentence (a full disk, say): W&B's errors closing its files
        # on that disk, and the tracebacks its log handlers print, must not follow it.
        raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False
        try:
            with contextlib.suppress(Exception):
                self.run.finish(exit_code=1)
                wandb.teardown()
        finally:
            logging.raiseExceptions = raise_exceptions


def build_logger(
    config: LoggerConfig,
    *,
    run_dir: Path,
    resolved_config: dict[str, Any],
    run_name: str,
    sweep_name: str | None = None,
    logged_through_step: int | None = None,
) -> NullLogger | WandbLogger:
    """The logger chosen by `config.kind`.

    `sweep_name`: the Hydra multirun's sweep directory name, so that one multirun is one W&B
    group; used when `config.group` is None, else the run's own name is its group.
    `logged_through_step`: a resumed run's last step already in the W&B history, else None.
    """
    match config.kind:
        case LoggerKind.none:
            return NullLogger()
        case LoggerKind.wandb:
            return WandbLogger(
                start_wandb_run(
                    config,
                    run_dir=Path(run_dir),
                    resolved_config=resolved_config,
                    run_name=run_name,
                    sweep_name=sweep_name,
                ),
                logged_through_step=logged_through_step,
            )


def start_wandb_run(
    config: LoggerConfig,
    *,
    run_dir: Path,
    resolved_config: dict[str, Any],
    run_name: str,
    sweep_name: str | None,
) -> "wandb.Run":
    import wandb  # noqa: PLC0415  (module constants above)

    run_dir.mkdir(parents=True, exist_ok=True)
    check_room(run_dir / WANDB_DIR)
    return wandb.init(
        project=config.project,
        entity=config.entity,
        group=config.group or sweep_name or run_name,
        job_type=config.job_type,
        tags=list(config.tags),
        name=run_name,
        config=to_plain(resolved_config),
        dir=str(run_dir),
        id=load_or_create_run_id(run_dir),
        resume="allow",
        # WANDB_MODE passes through in W&B's own spellings; its settings also take `dryrun`
        # and `run`, which the annotation of `init` leaves out
        mode=checked_mode(config),  # type: ignore[arg-type]
    )


def check_room(directory: Path) -> None:
    """`directory` takes `WANDB_ROOM_BYTES`: W&B's service process drops what a full disk
    refuses without a word (its history file stays empty) while its log handlers print a
    traceback a line, so a disk without room for its first files is refused before it starts."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory) as probe:
            probe.write(bytes(WANDB_ROOM_BYTES))
            probe.flush()  # writes until every byte is down (a raw write may stop short)
    except OSError as error:
        kept = "the run's checkpoints and metrics.jsonl are intact (or run with logger=none)"
        raise unwritable(directory, error, kept=kept) from None


def load_or_create_run_id(run_dir: Path) -> str:
    """The W&B run id of this run directory, created and saved on first use."""
    path = run_dir / RUN_ID_FILE
    if path.exists():
        return path.read_text().strip()
    run_id = secrets.token_hex(6)  # W&B ids: lowercase letters and digits
    path.write_text(run_id + "\n")
    return run_id


def resolve_mode(mode: WandbMode | None) -> str:
    """`mode` if set; else WANDB_MODE if set; else by local credentials. Always explicit: W&B's
    process-wide settings are fixed by the first run of a process, so a later run that left the
    mode to W&B would not see a WANDB_MODE set after that."""
    if mode is not None:
        return mode.value
    if os.environ.get(MODE_ENV):
        return os.environ[MODE_ENV]
    return WandbMode.online.value if has_wandb_credentials() else WandbMode.offline.value


def has_wandb_credentials() -> bool:
    """Whether W&B credentials are configured here, read from environment and netrc only.

    Mirrors W&B's own lookup (WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, then the netrc entry for
    the WANDB_BASE_URL host) with the standard library, because W&B's reader is a private
    module whose location changes between releases.
    """
    if os.environ.get(API_KEY_ENV) or os.environ.get(IDENTITY_TOKEN_FILE_ENV):
        return True
    hosts = {
        urllib.parse.urlsplit(url).hostname or "" for url in (wandb_base_url(), DEFAULT_WANDB_HOST)
    }
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        entries = [netrc.netrc(path).authenticators(host) for host in sorted(hosts)]
    except (OSError, netrc.NetrcParseError):
        return False
    return any(entry is not None and bool(entry[2]) for entry in entries)


def wandb_base_url() -> str:
    """The W&B server this process would talk to: WANDB_BASE_URL, else W&B's default."""
    if os.environ.get(BASE_URL_ENV):
        return os.environ[BASE_URL_ENV]
    import wandb  # noqa: PLC0415

    return wandb.Settings().base_url


def checked_mode(config: LoggerConfig) -> str:
    """`resolve_mode`, made sure to work here: an online mode without credentials or without a
    reachable server is refused (`ConfigError` with the fix) or, when allowed, becomes offline."""
    mode = resolve_mode(config.mode)
    if mode != WandbMode.online.value:
        return mode
    asked = (
        "logger.mode=online"
        if config.mode is not None
        else (f"{MODE_ENV}=online" if os.environ.get(MODE_ENV) else None)
    )
    problem = _online_problem(
        wandb_base_url(), has_wandb_credentials(), os.environ.get(API_KEY_ENV)
    )
    if problem is None:
        return mode
    if asked is not None and not config.offline_fallback:
        raise ConfigError(
            f"{asked} cannot work here: {problem}; log offline with logger.mode=offline (upload "
            "later with `wandb sync <run dir>/wandb`), add logger.offline_fallback=true to fall "
            "back to offline whenever online fails, or turn W&B off with logger=none."
        )
    _print_fallback(
        f"W&B logs offline ({problem}); upload later with `wandb sync <run dir>/wandb`."
    )
    return WandbMode.offline.value


@functools.cache
def _online_problem(base_url: str, has_credentials: bool, api_key: str | None) -> str | None:
    """Why online W&B cannot work (None: it can); the server probe runs once per process."""
    if not has_credentials:
        return (
            "no W&B credentials are configured (WANDB_API_KEY, or a netrc entry from `wandb login`)"
        )
    key_problem = _api_key_problem(api_key)
    if key_problem:
        return f"{API_KEY_ENV} is malformed ({key_problem.rstrip('.')})"
    if not answers(base_url):
        return (
            f"the W&B server {base_url} does not answer from this machine within "
            f"{PROBE_TIMEOUT_S:g} s"
        )
    return None


def _api_key_problem(key: str | None) -> str | None:
    """W&B's own local format check of an API key (no network), where this W&B version has it."""
    try:
        from wandb.sdk.lib.wbauth.validation import check_api_key  # noqa: PLC0415
    except ImportError:  # the check moved: W&B itself reports the key at wandb.init
        return None
    return check_api_key(key) if key else None


@functools.cache
def _print_fallback(notice: str) -> None:
    print(f"warning: {notice}", file=sys.stderr, flush=True)  # once per process


def to_plain(value: Any) -> Any:
    """Dataclasses, enums and paths -> JSON-like values, so W&B shows the config as written."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value
