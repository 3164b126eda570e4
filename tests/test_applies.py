"""No key is accepted and unused: every key of every group, set under every model family, dense
or mixture of experts, adapter, engine, dataset kind and placement, either reaches what runs
or is refused in one sentence (issue 43; the table is `locoexp.applies`).

"Reaches what runs" is observed, not declared: each base run's config is traced while the run's
own builders consume it, and a key counts where a consumer reads it. The consumers are
`build_spec` (layout, memory plan, step settings, loop and survival plans), the trainer's and
the engine's programs lowered abstractly at the tiny models' size (`locoexp.compiled.programs`
without XLA's compile), the task with its rows (`build_task`; `datasets.load_dataset` answers
with two rows in memory, the one thing replaced), the schedule, and the W&B run's start
(`wandb.init` recorded, not called). Reads by the schemas' own checks, by copies and by the
run's digest (every key, read or not) do not count. The programs read the same keys at any
caps, so they are lowered once per model, adapter and engine, not per dataset kind.
"""

import copy
import dataclasses
import enum
import functools
import sys
import types
import typing
from pathlib import Path

import jax
import pytest

import locoexp.compiled.programs as programs
from locoexp.compose import compose_config
from locoexp.config import Config
from locoexp.dataset.build import build_task, needed_columns
from locoexp.dataset.config import DatasetKind
from locoexp.dataset.schedule import build_schedule
from locoexp.errors import ConfigError
from locoexp.session.build import build_spec

MODELS = {
    "qwen3 dense": ["model=tiny"],
    "qwen3 moe": ["model=tiny_qwen3_moe"],
    "gemma4 moe": ["model=tiny_gemma4_moe"],
    "gemma4 dense": [
        "model=tiny_gemma4_moe",
        "model.num_experts=0",
        "model.experts_per_token=0",
        "model.expert_mlp_dim=0",
        "model.router_aux_loss_coef=0",
    ],
}
ADAPTERS = ("none", "lora")
ENGINES = ("jax", "vllm")
DATASETS = tuple(k.value for k in DatasetKind)
PLACEMENTS = {
    "co": ["placement=co"],
    "single_controller": ["placement=single_controller"],
    "da": ["placement=da", "split=0.5"],
}
# A value for keys whose generic other value (`other_value`) is out of range where they apply.
OTHER = {
    "model.global_rotary_fraction": 0.5,
    "rollout.top_p": 0.5,
    "hardware.process_id": 0,
    "hardware.coordinator_address": "127.0.0.1:8476",
    "hardware.bind_address": "127.0.0.1",
    "hardware.topology": "2x2x1",
    "dataset.prompt_template": "Q: {problem}",
    "logger.mode": "offline",
    "dry_run": "true",
}
# What a run's records name it by rather than what it computes (Appendix A's repeat index):
# read by the analysis from the run directory's config, not by the run.
LABELS = {"launch"}
# Read by `locoexp.main.run` before anything is built (the dry run or the run).
ENTRY = {"dry_run"}
# Read by a step, which this test does not run (each has tests of what it changes): O3 and the
# pretokenized prompts by the rollout half's admission (test_admission.py, test_host_shares.py),
# O4 by the publication (test_engine.py), the straggler's slow-down after generation
# (test_own_pace.py), and vLLM's eager mode by `VllmEngine` (vLLM is not installed here).
STEP = {
    "opt.balance_prompts",
    "opt.pretokenize_prompts",
    "opt.publish_in_one_call",
    "rollout.straggler.delay_s",
    "rollout.straggler.factor",
    "rollout.enforce_eager",
}
# Known and reported in the branch's note: the swe_agent option describes its data with it, and
# the plan reads it under trainer.accumulate=false and rollout.kv_cache=paged only.
KNOWN_UNREAD = {"dataset.mean_sequence_tokens"}


def leaf_keys(node: type, prefix: str = "") -> list[tuple[str, typing.Any]]:
    """(dotted key, annotation) of every leaf field of a schema dataclass."""
    keys = []
    for field in dataclasses.fields(node):
        if dataclasses.is_dataclass(field.type):
            keys += leaf_keys(field.type, f"{prefix}{field.name}.")
        else:
            keys.append((prefix + field.name, field.type))
    return keys


def other_value(key: str, annotation, value):
    """A value of `annotation` other than `value`, in range where the key applies."""
    if key in OTHER:
        return OTHER[key]
    options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    kind = next((t for t in options if t is not type(None)), annotation)
    origin = typing.get_origin(kind)
    if origin is list:
        (item,) = typing.get_args(kind)
        first = next(iter(item)) if isinstance(item, type) and issubclass(item, enum.Enum) else 1
        first = "tag" if item is str else first
        return [first] if value != [first] else [first, *list(item)[1:2]]
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return next(m for m in kind if m != value)
    if kind is bool:
        return not value
    if kind is int:
        return 1 if value in (None, 0) else value + 1
    if kind is float:
        return 0.5 if value in (None, 0.0) else value * 2 if value >= 1 else value / 2
    if kind is str:
        return "other" if value != "other" else "another"
    raise AssertionError(f"no other value for {key}: {annotation}")


def with_key(config: Config, key: str, value) -> Config:
    """`config` with `key` set, every schema on the way rebuilt (its checks run again)."""
    *parents, name = key.split(".")
    nodes = [config]
    for part in parents:
        nodes.append(getattr(nodes[-1], part))
    replaced = dataclasses.replace(nodes[-1], **{name: value})
    for node, part in zip(reversed(nodes[:-1]), reversed(parents), strict=True):
        replaced = dataclasses.replace(node, **{part: replaced})
    return replaced


# --- reads -----------------------------------------------------------------------------------

# Reads that are not a consumer's use: the schemas' checks (in their modules), the table's,
# copies, generated dunders, and the run's digest (which holds every key).
SCHEMA_FILES = ("config.py", "applies.py", "straggler.py")
SCHEMA_CHECKS = {"__post_init__", "traits", "check_targets", "_require_finite"}
NOT_A_USE_FILES = ("dataclasses.py", "copy.py", "copyreg.py", "<string>")
DIGEST = {"config_as_dict", "run_identity"}


def _is_use(frame) -> bool:
    while frame is not None and frame.f_code.co_filename != __file__:  # up to this test
        code = frame.f_code
        name, file = code.co_name, code.co_filename
        if file.endswith(NOT_A_USE_FILES) or name in DIGEST:
            return False
        if file.endswith(SCHEMA_FILES) and (name in SCHEMA_CHECKS or name.startswith("_check")):
            return False
        frame = frame.f_back
    return True


class Reads:
    """Which keys of a config its consumers read (`trace` swaps each schema's class for one that
    records attribute reads)."""

    def __init__(self):
        self.keys: set[str] = set()
        self._classes: dict[type, type] = {}

    def trace(self, config: Config) -> Config:
        """A copy of `config` whose reads are recorded (copies made from it are, too)."""
        config = copy.deepcopy(config)
        self._swap(config, "")
        return config

    def _swap(self, node, prefix: str) -> None:
        for field in dataclasses.fields(node):
            child = getattr(node, field.name)
            if dataclasses.is_dataclass(child):
                self._swap(child, f"{prefix}{field.name}.")
        cls = type(node)
        if (cls, prefix) not in self._classes:
            self._classes[cls, prefix] = self._traced_class(cls, prefix)
        object.__setattr__(node, "__class__", self._classes[cls, prefix])

    def _traced_class(self, cls: type, prefix: str) -> type:
        reads, names = self, {f.name for f in dataclasses.fields(cls)}

        def __getattribute__(node, name):  # noqa: N807
            value = object.__getattribute__(node, name)
            use = name in names and not dataclasses.is_dataclass(value)
            if use and _is_use(sys._getframe(1)):
                reads.keys.add(prefix + name)
            return value

        return type(cls.__name__, (cls,), {"__getattribute__": __getattribute__})


def _lowered_only(role, name, lower, mesh):
    lower()  # traces the program with the run's config; XLA's compile is not needed
    return programs.ProgramMemory(role, name, 0.0, 0.0, 0.0, 0.0, 0.0)


def program_reads(config: Config) -> set[str]:
    """Keys the policy's build, the trainer's and the engine's programs (lowered on this
    process's device) and vLLM's engine arguments read."""
    from locoexp.compiled.verdict import run_shapes  # noqa: PLC0415
    from locoexp.model.checkpoint import load_model  # noqa: PLC0415
    from locoexp.rollout import vllm_engine  # noqa: PLC0415

    reads = Reads()
    traced = reads.trace(config)
    load_model(traced.model, seed=0)
    shapes = run_shapes(traced)
    original, programs._compiled = programs._compiled, _lowered_only
    try:
        # two layers: a Gemma4 local layer and its last, global one (the programs' reads are
        # the same at any depth)
        programs.compile_programs(shapes, jax.devices()[:1], layers=min(2, traced.model.num_layers))
    finally:
        programs._compiled = original
    if config.rollout.engine.value == "vllm":  # what `VllmEngine` passes vLLM (a TPU's)
        vllm_engine.platform_kwargs(traced.rollout, "tpu")
    return reads.keys


ROWS = {
    DatasetKind.gsm8k: {"question": "1 + 1?", "answer": "2 #### 2"},
    DatasetKind.numinamath_cot: {"problem": "1 + 1?", "solution": "\\boxed{2}"},
    DatasetKind.openmathinstruct2: {"problem": "1 + 1?", "expected_answer": "2"},
    DatasetKind.swe_agent: {
        "trajectory": [
            {"role": role, "system_prompt": "You fix bugs.", "text": text}
            for role, text in [("system", ""), ("user", "Fix it."), ("ai", "```\nls\n```")]
        ]
    },
}


def task_reads(config: Config, monkeypatch) -> set[str]:
    """Keys the task and its schedule read, `datasets.load_dataset` answering from memory."""
    import datasets  # noqa: PLC0415

    kind = config.dataset.kind
    row = ROWS.get(kind, {})
    assert set(row) == set(needed_columns(kind))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # no probe of the Hub
    monkeypatch.setattr(
        datasets,
        "load_dataset",
        lambda *args, **kwargs: datasets.Dataset.from_list([row, row]),
    )
    reads = Reads()
    traced = reads.trace(config)
    task = build_task(traced.dataset, tokenizer_dir=None, vocab_size=traced.model.vocab_size)
    assert task.train  # the rows became prompts
    build_schedule(traced.dataset, steps=traced.steps, num_examples=10**6)  # a long split
    return reads.keys


def logger_reads(config: Config, tmp_path: Path, monkeypatch) -> set[str]:
    """Keys the logger reads starting its run (`wandb.init` recorded, not called)."""
    import wandb  # noqa: PLC0415

    from locoexp.metrics.wandb_logger import build_logger  # noqa: PLC0415

    monkeypatch.setattr(wandb, "init", lambda **kwargs: kwargs)
    monkeypatch.setattr("locoexp.metrics.wandb_logger.WandbLogger", lambda run, **_: run)
    reads = Reads()
    traced = reads.trace(config)
    build_logger(traced.logger, run_dir=tmp_path, resolved_config={}, run_name="run")
    # asked online (WANDB_MODE) on a machine without W&B credentials: the fallback is read
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setattr("locoexp.metrics.wandb_logger.has_wandb_credentials", lambda: False)
    with pytest.raises(ConfigError):
        build_logger(traced.logger, run_dir=tmp_path, resolved_config={}, run_name="run")
    monkeypatch.delenv("WANDB_MODE")
    return reads.keys


def spec_reads(config: Config) -> set[str]:
    reads = Reads()
    traced = reads.trace(config)
    build_spec(traced)
    return reads.keys


# --- the test -------------------------------------------------------------------------------


@functools.cache
def composed(*overrides: str) -> Config:
    return compose_config(["logger=none", *overrides])


def base_config(model: str, adapter: str, engine: str, dataset: str, placement: str) -> Config:
    """The run of one cell: each group's option composed as the command line would."""
    parts = composed(*MODELS[model], f"adapter={adapter}")
    return dataclasses.replace(
        composed(*PLACEMENTS[placement]),
        model=parts.model,
        adapter=parts.adapter,
        rollout=composed(f"rollout={engine}").rollout,
        dataset=composed(f"dataset={dataset}").dataset,
        logger=composed("logger=wandb").logger,
    )


# Keys the command line names by their group's option (`placement=da`, `rollout=vllm`).
OPTION_KEYS = {
    "model.family": "model.family",
    "adapter.kind": "adapter=",
    "rollout.engine": "rollout=",
    "dataset.kind": "dataset=",
    "placement.kind": "placement=",
    "hardware.chip": "hardware.chip",
    "logger.kind": "logger=",
}


def one_sentence_naming(error: ConfigError, key: str) -> bool:
    text = str(error)
    return "\n" not in text and text.endswith(".") and OPTION_KEYS.get(key, key) in text


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.slow
def test_every_key_of_every_group_reaches_what_runs_or_is_refused(model, tmp_path, monkeypatch):
    keys = leaf_keys(Config)
    cells = [
        (model, a, e, d, p) for a in ADAPTERS for e in ENGINES for d in DATASETS for p in PLACEMENTS
    ]
    programs_of: dict[tuple, set[str]] = {}
    tasks_of: dict[str, set[str]] = {}
    loggers = logger_reads(base_config(*cells[0]), tmp_path, monkeypatch)
    unused: dict[str, list[str]] = {}
    unclear: dict[str, str] = {}
    checked = 0
    for cell in cells:
        model, adapter, engine, dataset, placement = cell
        base = base_config(*cell)
        if (model, adapter, engine) not in programs_of:  # the programs read the same at any caps
            programs_of[model, adapter, engine] = program_reads(
                base_config(model, adapter, engine, "synthetic", "co")
            )
        if dataset not in tasks_of:
            tasks_of[dataset] = task_reads(base, monkeypatch)
        read = spec_reads(base) | programs_of[model, adapter, engine] | tasks_of[dataset]
        read |= loggers
        for key, annotation in keys:
            value = base
            for part in key.split("."):
                value = getattr(value, part)
            try:
                with_key(base, key, other_value(key, annotation, value))
            except ConfigError as error:
                if not one_sentence_naming(error, key):
                    unclear.setdefault(key, f"{' '.join(cell)}: {error}")
                continue
            checked += 1
            if key not in read and key not in LABELS | ENTRY | STEP | KNOWN_UNREAD:
                unused.setdefault(key, []).append(" ".join(cell))
    assert not unclear, "refusals that do not name the key:\n" + "\n".join(
        f"{key} ({cell})" for key, cell in unclear.items()
    )
    assert not unused, f"{len(unused)} keys accepted and unused:\n" + "\n".join(
        f"{key}: {len(cells)} cells, e.g. {cells[0]}" for key, cells in unused.items()
    )
    assert checked > len(cells) * len(keys) // 3  # most settings are valid somewhere


@pytest.mark.parametrize(
    ("overrides", "key", "where"),
    [
        (["model.sliding_window=4"], "model.sliding_window=4", "model.family=gemma4"),
        (["model.experts_per_token=2"], "model.experts_per_token=2", "mixture-of-experts"),
        (["adapter.rank=8"], "adapter.rank=8", "adapter=lora"),
        (["model.rope_low_freq_factor=2"], "model.rope_low_freq_factor=2.0", "RoPE scaling"),
        (["rollout.kv_cache_gib=1"], "rollout.kv_cache_gib=1.0", "rollout=vllm"),
        (["logger=none", "logger.project=x"], "logger.project='x'", "logger=wandb"),
    ],
)
def test_a_key_set_where_it_is_not_read_is_refused_naming_value_and_where(overrides, key, where):
    with pytest.raises(ConfigError) as refused:
        compose_config(overrides)
    text = str(refused.value)
    assert text.startswith(f"{key} is not read by this run (") and where in text
    assert "\n" not in text
