"""Per-device memory of the trainer and the rollout engine, the start-up fit check, the plan.

It owns arithmetic only: nothing here allocates, traces a computation or touches a device, so
`dry_run=true` and the start-up refusal cost milliseconds even for Llama-3.1-405B. Callers pass
sub-configs and a `Roles` of scalars, never the root config.

The estimate, in bytes per device (GiB = 2**30 bytes); `a` = bytes per element of
`model.param_dtype` (the decoder computes in its parameter dtype), `n` = parameters, N = B*G
sequences per step, L = trainer row length (`trainer.row_tokens`, default the caps P + R
rounded up to 8), H/K query/KV heads, h head_dim, D width, F MLP width, V vocabulary.

Trainer (locoexp/trainer), FSDP over its `Dt` devices, one update per step and no gradient
accumulation, so the whole packed batch is live at once (the paper's note under Table 3):
  params n*a/Dt + gradients n*a/Dt + AdamW m and v 2*n*a/Dt (optax keeps them in param dtype)
  [+ the KL reference policy n*a/Dt when algo.kl_coef > 0]
  + one gathered block, the FSDP all-gather of the layer being computed: a * block params
  + activations. At the caps a row holds floor(L / (P + R)) sequences, one at the default L
    (packing cannot do better in the worst case, and a trainer without accumulation must
    survive the worst step), so a device holds r = next_pow2(ceil(rows / Dt)) rows of L tokens
    (packing rounds rows per device up to a power of two). Per token and layer the remat-free
    backward keeps the inputs of every matmul and nonlinearity at `a` bytes: the block input
    and its RMSNorm output (2D), q and k before the q/k norm (Qwen3 only) and after RoPE, v
    ((H+K)h [+ (H+K)h] + Kh), the o_proj input (Hh), the post-attention residual and its norm
    output (2D), the gate and up outputs and their product (3F); plus the attention
    probabilities, which the decoder materialises densely, H*L float32, and the row's [L, L]
    boolean mask, L bytes. After the last layer: the final norm's input and output (2D at `a`).
    The head runs on the loss slots only (R per sequence, split over devices), rematerialised
    per chunk of trainer.logit_chunk_tokens: the gathered hidden states of the slots (D at `a`
    each) and one chunk's logits and their gradient (2 * chunk * V float32).
  Not counted: XLA temporaries and fragmentation, the packed batch's integer inputs.
Rollout engine, one weight replica per TP group of `t` devices (the built-in jax engine is
TP1: a replica per device):
  weights n*a/t + KV cache s*S*layers*2*ceil(K/t)*h*a, for s = ceil(capacity / (devices per
  engine / t)) sequences per replica and S = P' + R slots, P' = the engine's padded prompt
  length (the next power of two, at least rollout.prompt_bucket_tokens); capacity 0 means all
  of the engine's requests at once. With
  t > K the KV heads are replicated, not split (ceil). Prefill attends densely, so one layer's
  scores s*(H/t)*P'*S float32 are live at once on top.
Colocated (co, single_controller): the trainer's step also holds the engine's weight replica,
and generation also holds the trainer's params and AdamW state; the KV cache is freed between
rollouts and activations between steps.

Calibration: the paper's 157.6 GiB (Qwen3-0.6B, SWE, 8 chips) was measured on a trainer with
fused attention and real, packed lengths. This estimate is at the caps and with dense
attention, so it refuses that case by a much larger figure and it refuses earlier in general;
it is exact in the terms it lists (checked in tests/test_memory.py), not a profile of XLA.
"""

import dataclasses
import math

from locoexp.dataset.config import DatasetConfig
from locoexp.errors import ConfigError, require
from locoexp.hardware.config import HardwareConfig
from locoexp.model.config import DType, ModelConfig
from locoexp.model.sizes import count_block_parameters, count_parameters_by_formula
from locoexp.rollout.config import RolloutConfig
from locoexp.rollout.engine import prompt_bucket
from locoexp.trainer.config import TrainerConfig

GIB = 2**30
_BYTES = {DType.float32: 4, DType.bfloat16: 2}
_F32 = 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class Roles:
    """Which hosts train and which generate. The placements map onto it as:

    co: Roles(trainer_hosts=H, rollout_hosts=H, colocated=True)
    da: Roles(trainer_hosts=split*H, rollout_hosts=H - split*H, colocated=False)
    single_controller: Roles(trainer_hosts=H, rollout_hosts=H, colocated=True, hosts_per_engine=H)
    """

    trainer_hosts: int
    rollout_hosts: int
    colocated: bool
    hosts_per_engine: int = 1  # 1 = host-local engines (LoCoJAX); H = one lockstep engine
    kl_reference: bool = False  # the trainer also keeps the initial policy (algo.kl_coef > 0)

    def __post_init__(self):
        require(
            self.trainer_hosts >= 1 and self.rollout_hosts >= 1,
            "the trainer and the rollout engines each need at least one host.",
        )
        require(
            self.rollout_hosts % self.hosts_per_engine == 0,
            f"{self.rollout_hosts} rollout hosts do not split into engines of "
            f"{self.hosts_per_engine} hosts.",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerMemory:
    """Bytes per trainer device, by term."""

    devices: int
    rows: int  # packed rows per device at the caps
    row_tokens: int
    params: int
    gradients: int
    optimizer: int  # AdamW m and v
    reference: int  # the KL reference policy (algo.kl_coef > 0), else 0
    gathered_block: int
    activations: int

    @property
    def total(self) -> int:
        state = self.params + self.gradients + self.optimizer + self.reference
        return state + self.gathered_block + self.activations

    @property
    def resident(self) -> int:
        """What outlives a step: params, optimizer state and the reference policy."""
        return self.params + self.optimizer + self.reference


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineMemory:
    """Bytes per rollout device, by term."""

    tensor_parallel: int
    replicas_per_engine: int
    sequences_per_replica: int
    weights: int
    kv_cache: int
    prefill_scores: int  # one layer's dense attention scores during prefill

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.prefill_scores


def _param_bytes(model: ModelConfig) -> int:
    return _BYTES[model.param_dtype]


def activation_bytes_per_token(model: ModelConfig, row_tokens: int) -> int:
    """Bytes the remat-free backward keeps per token of a row of `row_tokens` (module note)."""
    c, a = model, _param_bytes(model)
    qk = (c.num_heads + c.num_kv_heads) * c.head_dim
    per_layer = 4 * c.hidden_dim + qk * (2 if c.qk_norm else 1) + c.num_kv_heads * c.head_dim
    per_layer += c.num_heads * c.head_dim + 3 * c.mlp_dim
    attention = c.num_heads * row_tokens * _F32 + row_tokens  # probabilities and the bool mask
    return c.num_layers * (per_layer * a + attention) + 2 * c.hidden_dim * a


def _next_power_of_two(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


def trainer_row_tokens(dataset: DatasetConfig, trainer: TrainerConfig) -> int:
    """The packed row length L the trainer uses (what locoexp.main passes to packing)."""
    caps = dataset.max_prompt_tokens + dataset.max_new_tokens
    return trainer.row_tokens or -(-caps // 8) * 8


def estimate_trainer_memory(
    model: ModelConfig,
    dataset: DatasetConfig,
    trainer: TrainerConfig,
    *,
    devices: int,
    reference_policy: bool = False,
) -> TrainerMemory:
    """Per-device bytes of an FSDP trainer over `devices` devices at the dataset's caps."""
    a, n = _param_bytes(model), count_parameters_by_formula(model)
    shard = math.ceil(n / devices) * a
    sequences = dataset.prompts_per_step * dataset.samples_per_prompt
    row_tokens = trainer_row_tokens(dataset, trainer)
    per_row = max(row_tokens // (dataset.max_prompt_tokens + dataset.max_new_tokens), 1)
    rows = _next_power_of_two(math.ceil(math.ceil(sequences / per_row) / devices))
    slots = math.ceil(sequences * dataset.max_new_tokens / devices)
    chunk = min(trainer.logit_chunk_tokens, sequences * dataset.max_new_tokens)
    head = slots * model.hidden_dim * a + 2 * chunk * model.vocab_size * _F32
    return TrainerMemory(
        devices=devices,
        rows=rows,
        row_tokens=row_tokens,
        params=shard,
        gradients=shard,
        optimizer=2 * shard,
        reference=shard if reference_policy else 0,
        gathered_block=count_block_parameters(model) * a,
        activations=rows * row_tokens * activation_bytes_per_token(model, row_tokens) + head,
    )


def estimate_engine_memory(
    model: ModelConfig,
    dataset: DatasetConfig,
    rollout: RolloutConfig,
    *,
    engine_devices: int,
    engines: int,
) -> EngineMemory:
    """Per-device bytes of one of `engines` engines, each over `engine_devices` devices."""
    t, a = rollout.tensor_parallel, _param_bytes(model)
    replicas = max(engine_devices // t, 1)
    requests = math.ceil(dataset.prompts_per_step * dataset.samples_per_prompt / engines)
    concurrent = min(rollout.capacity, requests) if rollout.capacity else requests
    per_replica = math.ceil(concurrent / replicas)
    prompt = prompt_bucket(dataset.max_prompt_tokens, rollout.prompt_bucket_tokens)
    slots = prompt + dataset.max_new_tokens
    kv_per_token = model.num_layers * 2 * math.ceil(model.num_kv_heads / t) * model.head_dim * a
    return EngineMemory(
        tensor_parallel=t,
        replicas_per_engine=replicas,
        sequences_per_replica=per_replica,
        weights=math.ceil(count_parameters_by_formula(model) / t) * a,
        kv_cache=per_replica * slots * kv_per_token,
        prefill_scores=per_replica * (model.num_heads // t) * prompt * slots * _F32,
    )


def valid_tensor_parallel(model: ModelConfig, engine_devices: int) -> list[int]:
    """TP degrees that split the query heads evenly and tile an engine's devices."""
    return [
        t
        for t in range(1, engine_devices + 1)
        if model.num_heads % t == 0 and engine_devices % t == 0
    ]


def check_tensor_parallel(
    model: ModelConfig, rollout: RolloutConfig, *, engine_devices: int
) -> None:
    """Refuse a rollout TP degree that does not divide the heads or the engine's devices."""
    t = rollout.tensor_parallel
    valid = ", ".join(map(str, valid_tensor_parallel(model, engine_devices)))
    require(
        model.num_heads % t == 0,
        f"rollout.tensor_parallel={t} does not divide model.num_heads={model.num_heads} "
        f"({model.name}): valid TP degrees for {engine_devices} devices per engine are {valid}.",
    )
    require(
        engine_devices % t == 0,
        f"rollout.tensor_parallel={t} does not divide the {engine_devices} devices of a rollout "
        f"engine (hardware.chips_per_host x hardware.devices_per_chip per host): valid TP "
        f"degrees are {valid}.",
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Both estimates and the per-device peak of each phase (bytes)."""

    trainer: TrainerMemory
    engine: EngineMemory
    trainer_peak: int  # the training step, plus the engine's weights when colocated
    engine_peak: int  # generation, plus the trainer's params and AdamW state when colocated


def plan_memory(
    model: ModelConfig,
    hardware: HardwareConfig,
    rollout: RolloutConfig,
    dataset: DatasetConfig,
    trainer: TrainerConfig,
    roles: Roles,
) -> MemoryPlan:
    """Estimate both roles on `hardware` as `roles` places them."""
    devices = roles.trainer_hosts * hardware.devices_per_host
    trainer_memory = estimate_trainer_memory(
        model, dataset, trainer, devices=devices, reference_policy=roles.kl_reference
    )
    engine = estimate_engine_memory(
        model,
        dataset,
        rollout,
        engine_devices=roles.hosts_per_engine * hardware.devices_per_host,
        engines=roles.rollout_hosts // roles.hosts_per_engine,
    )
    shared = roles.colocated
    return MemoryPlan(
        trainer=trainer_memory,
        engine=engine,
        trainer_peak=trainer_memory.total + (engine.weights if shared else 0),
        engine_peak=engine.total + (trainer_memory.resident if shared else 0),
    )


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f}"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def check_fit(
    model: ModelConfig,
    hardware: HardwareConfig,
    rollout: RolloutConfig,
    dataset: DatasetConfig,
    trainer: TrainerConfig,
    roles: Roles,
) -> None:
    """Refuse, in the paper's words, a TP degree or a role that does not fit a device."""
    check_tensor_parallel(
        model, rollout, engine_devices=roles.hosts_per_engine * hardware.devices_per_host
    )
    plan = plan_memory(model, hardware, rollout, dataset, trainer, roles)
    capacity = hardware.memory_per_device_gib * GIB
    remedy = (
        "more hosts, fewer dataset.prompts_per_step or dataset.samples_per_prompt, lower "
        "dataset.max_prompt_tokens or dataset.max_new_tokens, or model.param_dtype=bfloat16"
    )
    t = plan.trainer
    require(
        plan.trainer_peak <= capacity,
        f"does not fit: the trainer needs {_gib(plan.trainer_peak)} GiB per device of "
        f"{hardware.memory_per_device_gib:.1f} (hardware.memory_per_device_gib): {t.rows} rows x "
        f"{t.row_tokens} tokens on each of {_n(t.devices, 'device')}; try {remedy}, or a shorter "
        "trainer.row_tokens.",
    )
    e = plan.engine
    require(
        plan.engine_peak <= capacity,
        f"does not fit: the rollout engine needs {_gib(plan.engine_peak)} GiB per device of "
        f"{hardware.memory_per_device_gib:.1f} (hardware.memory_per_device_gib): "
        f"{e.sequences_per_replica} sequences per replica at rollout.tensor_parallel="
        f"{e.tensor_parallel}; try a lower rollout.capacity, a higher rollout.tensor_parallel, "
        f"or {remedy}.",
    )


def _trainer_line(plan: MemoryPlan, roles: Roles) -> str:
    t, e = plan.trainer, plan.engine
    terms = [
        f"params {_gib(t.params)}",
        f"gradients {_gib(t.gradients)}",
        f"AdamW {_gib(t.optimizer)}",
        f"gathered block {_gib(t.gathered_block)}",
        f"activations {_gib(t.activations)}",
    ]
    terms += [f"KL reference {_gib(t.reference)}"] if roles.kl_reference else []
    terms += [f"engine weights {_gib(e.weights)}"] if roles.colocated else []
    return (
        f"trainer: {_n(roles.trainer_hosts, 'host')}, {_n(t.devices, 'device')} (FSDP), "
        f"{t.rows} rows x {t.row_tokens} tokens per device; "
        f"{_gib(plan.trainer_peak)} GiB per device = " + " + ".join(terms)
    )


def _engine_line(plan: MemoryPlan, roles: Roles, devices_per_host: int) -> str:
    t, e = plan.trainer, plan.engine
    terms = [f"weights {_gib(e.weights)}", f"KV cache {_gib(e.kv_cache)}"]
    terms += [f"prefill scores {_gib(e.prefill_scores)}"]
    terms += [f"trainer params and AdamW {_gib(t.resident)}"] if roles.colocated else []
    engines = roles.rollout_hosts // roles.hosts_per_engine
    return (
        f"rollout: {_n(roles.rollout_hosts, 'host')}, {_n(engines, 'engine')} of "
        f"{_n(roles.hosts_per_engine * devices_per_host, 'device')}, DP{e.replicas_per_engine} x "
        f"TP{e.tensor_parallel}, {e.sequences_per_replica} sequences per replica; "
        f"{_gib(plan.engine_peak)} GiB per device = " + " + ".join(terms)
    )


def describe_plan(
    model: ModelConfig,
    hardware: HardwareConfig,
    rollout: RolloutConfig,
    dataset: DatasetConfig,
    trainer: TrainerConfig,
    roles: Roles,
) -> str:
    """The dry-run report: hosts, devices per role, memory per device, parameter count."""
    try:
        check_fit(model, hardware, rollout, dataset, trainer, roles)
        verdict = "fits"
    except ConfigError as error:
        verdict = str(error)
    if model.num_heads % rollout.tensor_parallel:
        return f"model {model.name}: {verdict}"
    plan = plan_memory(model, hardware, rollout, dataset, trainer, roles)
    return "\n".join(
        [
            f"model {model.name}: {count_parameters_by_formula(model) / 1e9:.3f}B parameters, "
            f"{model.param_dtype.value}",
            f"hardware {hardware.chip.value}: {_n(hardware.hosts, 'host')} x "
            f"{_n(hardware.devices_per_host, 'device')}, {hardware.memory_per_device_gib:.1f} GiB "
            "per device",
            _trainer_line(plan, roles),
            _engine_line(plan, roles, hardware.devices_per_host),
            f"placement: {'colocated' if roles.colocated else 'disaggregated'}; {verdict}",
        ]
    )
