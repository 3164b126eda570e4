"""Which config key applies to which run: one table (`APPLIES`), and the refusal of every key
set where its row does not hold.

A key applies to a run when the run's code reads it: Gemma4's attention keys only on a Gemma4
model, the experts' keys only on a mixture of experts, LoRA's only under `adapter=lora`, vLLM's
only under `rollout=vllm`, a dataset kind's only under that kind, Ray's only under
`placement=da`. Each row is a key (dotted, as on the command line; a row naming a sub-config
covers each key under it) and `When`: a predicate over `RunTraits` (model family, dense or
mixture of experts, adapter, engine, dataset kind, the layout's properties and the few switches
that decide whether another key is read) with the sentence that names where the key applies. A
key without a row applies to every run. A key is *set* when its value differs from its
dataclass default; a set key whose row does not hold is refused with one sentence naming the
key, its value and where it applies (`refuse_unread_keys`), never dropped. A new key costs one
field and, where only some runs read it, one row.

Rows marked `refuse=False` are start-up notices instead (`unread_notices`): a sweep may set such
a key in every cell and switch off what reads it in one (`rollout.straggler.host` in a cell
whose delay is 0).

This module decides applicability only; value ranges stay with each schema's `__post_init__`
and cross-group arithmetic with the root `Config`. Jax-free: it imports only the schemas.
"""

import dataclasses
import enum
from collections.abc import Callable, Iterator
from typing import Any

from locoexp.adapter.config import AdapterKind
from locoexp.algo.config import AdvantageKind
from locoexp.dataset.config import DatasetKind
from locoexp.errors import require
from locoexp.layout import Layout, PlacementKind
from locoexp.metrics.config import LoggerKind
from locoexp.model.config import AttentionKind, Family
from locoexp.rollout.config import EngineKind, KVCacheKind


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunTraits:
    """What decides whether a key is read: the run's kinds and its layout's properties."""

    family: Family
    moe: bool  # model.num_experts > 0
    rope_scaled: bool  # model.rope_scaling_factor != 1
    adapter: AdapterKind
    engine: EngineKind
    kv_cache: KVCacheKind  # rollout.kv_cache (the JAX engine's)
    dataset: DatasetKind
    local_files: bool  # dataset.data_files: the rows come from local files, not the Hub
    layout: Layout  # who runs where (`Config.layout`, its hosts resolved)
    tpu: bool  # hardware.chip is a TPU
    cluster_launched: bool  # hardware.coordinator_address: a cluster starts the hosts
    attention: AttentionKind
    accumulate: bool  # trainer.accumulate
    advantage: AdvantageKind
    logger: LoggerKind
    straggler: bool  # rollout.straggler slows a host (delay_s > 0 or factor > 1)

    @property
    def placement(self) -> PlacementKind:
        """The placement's name, for the sentences; the predicates ask the layout."""
        return self.layout.kind

    @property
    def hosts(self) -> int:
        return self.layout.hosts

    @property
    def colocated(self) -> bool:
        """Every host trains and generates (co, single_controller)."""
        return self.layout.colocated

    @property
    def disaggregated(self) -> bool:
        """Trainer hosts and rollout hosts apart, Ray actors of one driver (da)."""
        return self.layout.disaggregated

    @property
    def host_group(self) -> bool:
        """Several processes, one per host, joined by jax.distributed (co, H > 1)."""
        return self.layout.processes > 1


@dataclasses.dataclass(frozen=True)
class When:
    """Where a key applies: `where` says it as the user would set it, `holds` decides it and
    `this` names what the run has instead (for the refusal)."""

    where: str
    holds: Callable[[RunTraits], bool]
    this: Callable[[RunTraits], str]


def _model(r: RunTraits) -> str:
    scaled = "" if r.rope_scaled else ", model.rope_scaling_factor=1"
    return f"model.family={r.family.value}, {'MoE' if r.moe else 'dense'}{scaled}"


def _family(r: RunTraits) -> str:
    return f"model.family={r.family.value}"


def _engine(r: RunTraits) -> str:
    return f"rollout={r.engine.value}"


def _engine_and_model(r: RunTraits) -> str:
    return f"rollout={r.engine.value}, {'MoE' if r.moe else 'dense'}"


def _engine_and_placement(r: RunTraits) -> str:
    return f"rollout={r.engine.value}, placement={r.placement.value}"


def _placement(r: RunTraits) -> str:
    chip = "a TPU slice" if r.tpu else "hardware=cpu"
    return f"placement={r.placement.value}, {r.hosts} host{'s' * (r.hosts > 1)}, {chip}"


def _dataset(r: RunTraits) -> str:
    return f"dataset={r.dataset.value}"


QWEN3 = When(
    "model.family=qwen3",
    lambda r: r.family is Family.qwen3,
    _family,
)
ROPE_SCALED = When(
    "qwen3-family models with Llama-3.1 RoPE scaling (model.rope_scaling_factor > 1)",
    lambda r: r.family is Family.qwen3 and r.rope_scaled,
    _model,
)
DENSE_QWEN3 = When(
    "dense qwen3-family models (model.family=qwen3, model.num_experts=0)",
    lambda r: r.family is Family.qwen3 and not r.moe,
    _model,
)
GEMMA4 = When(
    "model.family=gemma4",
    lambda r: r.family is Family.gemma4,
    _family,
)
QWEN3_MOE = When(
    "qwen3-family mixture-of-experts models (Gemma4's router always normalises its top k)",
    lambda r: r.family is Family.qwen3 and r.moe,
    _model,
)
MOE = When(
    "mixture-of-experts models (model.num_experts > 0)",
    lambda r: r.moe,
    lambda r: "model.num_experts=0",
)
LORA = When(
    "adapter=lora", lambda r: r.adapter is AdapterKind.lora, lambda r: f"adapter={r.adapter.value}"
)
JAX = When("rollout=jax", lambda r: r.engine is EngineKind.jax, _engine)
VLLM = When("rollout=vllm", lambda r: r.engine is EngineKind.vllm, _engine)
JAX_MOE = When(
    "rollout=jax on mixture-of-experts models (model.num_experts > 0)",
    lambda r: r.engine is EngineKind.jax and r.moe,
    _engine_and_model,
)
JAX_PAGED = When(
    "rollout=jax with rollout.kv_cache=paged",
    lambda r: r.engine is EngineKind.jax and r.kv_cache is KVCacheKind.paged,
    lambda r: f"rollout={r.engine.value}, rollout.kv_cache={r.kv_cache.value}",
)
JAX_COLOCATED = When(
    "rollout=jax under placement=co or single_controller, whose engine shares the trainer's "
    "devices",
    lambda r: r.engine is EngineKind.jax and r.colocated,
    _engine_and_placement,
)
DA = When("placement=da", lambda r: r.disaggregated, _placement)
COLOCATED = When(
    "placement=co or single_controller (under da the hosts report to the Ray driver and share "
    "no per-host metrics barrier)",
    lambda r: r.colocated,
    _placement,
)
HOST_GROUP = When(
    "placement=co with hardware.hosts > 1, one process per host",
    lambda r: r.host_group,
    _placement,
)
LAUNCHER_PORT = When(
    "the jax.distributed coordinator this run starts: the local launcher's (hardware=cpu, "
    "placement=co, hardware.hosts > 1, no hardware.coordinator_address) and the placement=da "
    "trainer group's",
    lambda r: r.disaggregated or (r.host_group and not r.tpu and not r.cluster_launched),
    _placement,
)
LISTENS = When(
    "runs whose processes listen for each other (placement=co with hardware.hosts > 1, or "
    "placement=da)",
    lambda r: r.disaggregated or r.host_group,
    _placement,
)
CLUSTER_GROUP = When(
    "placement=co with hardware.hosts > 1 started by a cluster (a TPU slice, or "
    "hardware.coordinator_address)",
    lambda r: r.host_group and (r.tpu or r.cluster_launched),
    _placement,
)
TPU = When("a TPU slice (hardware=tpu_*)", lambda r: r.tpu, lambda r: "hardware=cpu")
BLOCKWISE = When(
    "trainer.attention=blockwise",
    lambda r: r.attention is AttentionKind.blockwise,
    lambda r: f"trainer.attention={r.attention.value}",
)
ACCUMULATE = When(
    "trainer.accumulate=true (the paper's layout, accumulate=false, trains every row in one pass)",
    lambda r: r.accumulate,
    lambda r: "trainer.accumulate=false",
)
GRPO = When(
    "algo.advantage=grpo (Dr. GRPO only centres)",
    lambda r: r.advantage is AdvantageKind.grpo,
    lambda r: f"algo.advantage={r.advantage.value}",
)
WANDB = When(
    "logger=wandb", lambda r: r.logger is LoggerKind.wandb, lambda r: f"logger={r.logger.value}"
)
STRAGGLER = When(
    "runs that slow a host (rollout.straggler.delay_s > 0 or rollout.straggler.factor > 1)",
    lambda r: r.straggler,
    lambda r: "no straggler",
)
_FILES = (
    DatasetKind.gsm8k,
    DatasetKind.numinamath_cot,
    DatasetKind.swe_agent,
    DatasetKind.openmathinstruct2,
)
FILES = When(
    "dataset=" + " or ".join(k.value for k in _FILES),
    lambda r: r.dataset in _FILES,
    _dataset,
)
LOCAL_FILES = When(
    FILES.where + " with local training files (dataset.data_files set; a Hub source's held-out "
    "split is dataset.eval_split)",
    lambda r: r.dataset in _FILES and r.local_files,
    lambda r: f"dataset={r.dataset.value}, dataset.data_files=null",
)
MATH = When(
    "dataset=gsm8k, numinamath_cot or openmathinstruct2 (SWE prompts are the trajectory itself)",
    lambda r: r.dataset in _FILES and r.dataset is not DatasetKind.swe_agent,
    _dataset,
)
SYNTHETIC = When(
    "dataset=synthetic",
    lambda r: r.dataset is DatasetKind.synthetic,
    _dataset,
)
RANDOM_TOKENS = When(
    "dataset=random_tokens",
    lambda r: r.dataset is DatasetKind.random_tokens,
    _dataset,
)


@dataclasses.dataclass(frozen=True)
class Row:
    when: When
    refuse: bool = True  # False: a start-up notice (`unread_notices`)


# Every key that only some runs read. Keys absent here apply to every run.
APPLIES: dict[str, Row] = {
    # model: the family's block, the experts, RoPE scaling
    "model.qk_norm": Row(QWEN3),  # Gemma4's attention always norms q and k
    "model.rope_scaling_factor": Row(QWEN3),
    "model.rope_low_freq_factor": Row(ROPE_SCALED),
    "model.rope_high_freq_factor": Row(ROPE_SCALED),
    "model.rope_original_max_positions": Row(ROPE_SCALED),
    "model.compute_dtype": Row(DENSE_QWEN3),
    "model.experts_per_token": Row(MOE),
    "model.expert_mlp_dim": Row(MOE),
    "model.normalize_top_k": Row(QWEN3_MOE),
    "model.router_aux_loss_coef": Row(MOE),
    "model.sliding_window": Row(GEMMA4),
    "model.global_attention_every": Row(GEMMA4),
    "model.global_head_dim": Row(GEMMA4),
    "model.global_kv_heads": Row(GEMMA4),
    "model.global_rope_theta": Row(GEMMA4),
    "model.global_rotary_fraction": Row(GEMMA4),
    "model.global_key_is_value": Row(GEMMA4),
    # adapter: what LoRA trains
    "adapter.rank": Row(LORA),
    "adapter.alpha": Row(LORA),
    "adapter.targets": Row(LORA),
    "adapter.dropout": Row(LORA),
    "adapter.seed": Row(LORA),
    "adapter.modules_to_save": Row(LORA),
    # trainer
    "trainer.attention_block_tokens": Row(BLOCKWISE),
    "trainer.micro_batch_rows": Row(ACCUMULATE),
    "trainer.expert_parallel": Row(MOE),
    # rollout: the built-in engine's and vLLM's own keys
    "rollout.scheduler": Row(JAX),  # vLLM always batches continuously
    # prompt_bucket_tokens and prefill_chunk_tokens have no row: the plan sizes vLLM's engine
    # by them too (the scale cells at 256 tokens)
    "rollout.expert_parallel": Row(JAX_MOE),
    "rollout.kv_cache": Row(JAX),  # vLLM always pages its cache
    "rollout.page_tokens": Row(JAX_PAGED),
    "rollout.kv_cache_pages_per_replica": Row(JAX_PAGED),
    "rollout.release_weights_during_training": Row(JAX_COLOCATED),
    "rollout.data_parallel": Row(VLLM),
    "rollout.memory_fraction": Row(VLLM),
    "rollout.kv_cache_gib": Row(VLLM),
    "rollout.enforce_eager": Row(VLLM),
    "rollout.straggler.host": Row(STRAGGLER, refuse=False),
    # dataset: what each kind's task reads
    "dataset.path": Row(FILES),
    "dataset.name": Row(FILES),
    "dataset.revision": Row(FILES),
    "dataset.data_files": Row(FILES),
    "dataset.eval_data_files": Row(LOCAL_FILES),
    "dataset.train_split": Row(FILES),
    "dataset.eval_split": Row(FILES),
    "dataset.max_train_rows": Row(FILES),
    "dataset.thinking": Row(FILES),  # the chat template's thinking mode
    "dataset.long_prompts": Row(FILES),
    "dataset.prompt_template": Row(MATH),
    "dataset.reward_workers": Row(FILES),  # the other tasks score in the host process
    "dataset.synthetic": Row(SYNTHETIC),
    "dataset.random_tokens": Row(RANDOM_TOKENS),
    # algo
    "algo.advantage_eps": Row(GRPO),
    # placement, the run's processes and where they meet
    "split": Row(DA),
    "placement.ray_address": Row(DA),
    "placement.rollout_restarts": Row(DA),
    "placement.rollout_restart_timeout_s": Row(DA),
    "placement.max_staleness": Row(DA),
    "opt.metrics_off_barrier": Row(COLOCATED),  # O1
    "hardware.topology": Row(TPU),
    "hardware.coordinator_port": Row(LAUNCHER_PORT),
    "hardware.bind_address": Row(LISTENS),
    "hardware.coordinator_address": Row(HOST_GROUP),
    "hardware.process_id": Row(HOST_GROUP),
    "hardware.coordinator_timeout_s": Row(CLUSTER_GROUP),
    # logger: what W&B reads
    "logger.project": Row(WANDB),
    "logger.entity": Row(WANDB),
    "logger.group": Row(WANDB),
    "logger.job_type": Row(WANDB),
    "logger.tags": Row(WANDB),
    "logger.mode": Row(WANDB),
    "logger.offline_fallback": Row(WANDB),
}


def set_keys(config: Any, key: str) -> Iterator[tuple[str, Any, Any]]:
    """(dotted key, value, default) of `key` in `config`, or of each key under it where `key`
    names a sub-config, where the value differs from the dataclass default."""
    *parents, name = key.split(".")
    node = config
    for part in parents:
        node = getattr(node, part)
    field = next(f for f in dataclasses.fields(node) if f.name == name)
    default = field.default if field.default_factory is dataclasses.MISSING else None
    if field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    value = getattr(node, name)
    if dataclasses.is_dataclass(default):
        for sub in dataclasses.fields(default):
            if getattr(value, sub.name) != getattr(default, sub.name):
                yield f"{key}.{sub.name}", getattr(value, sub.name), getattr(default, sub.name)
    elif value != default:
        yield key, value, default


def unread_sentence(key: str, value: Any, default: Any, when: When, traits: RunTraits) -> str:
    """The one sentence of a key set where it is not read."""
    return (
        f"{key}={shown(value)} is not read by this run ({when.this(traits)}): it applies only "
        f"to {when.where}; leave it at {_default(default)}."
    )


def refuse_unread_keys(config: Any, traits: RunTraits) -> None:
    """Refuse (`ConfigError`, one sentence) the first key set where its row does not hold."""
    for key, row in APPLIES.items():
        if not row.refuse or row.when.holds(traits):
            continue
        for name, value, default in set_keys(config, key):
            require(False, unread_sentence(name, value, default, row.when, traits))


def unread_notices(config: Any, traits: RunTraits) -> list[str]:
    """The start-up notices of the `refuse=False` rows: keys set where nothing reads them."""
    return [
        unread_sentence(name, value, default, row.when, traits)
        for key, row in APPLIES.items()
        if not row.refuse and not row.when.holds(traits)
        for name, value, default in set_keys(config, key)
    ]


def _default(value: Any) -> str:
    text = shown(value)
    return text if len(text) <= 40 else "its default"


def shown(value: Any) -> str:
    """A value as a user types it on the command line."""
    match value:
        case None:
            return "null"
        case bool():
            return str(value).lower()
        case enum.Enum():
            return value.value
        case str():
            return repr(value)
        case list():
            return "[" + ",".join(shown(v) for v in value) + "]"
    return str(value)
