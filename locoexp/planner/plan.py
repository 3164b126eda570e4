"""The memory plan of a run: roles on devices, resolved micro-batch and wave sizes, the fit.

It owns the two roles' shapes on the hardware (who runs where is `locoexp.layout.Layout`),
the resolution of `trainer.micro_batch_rows=0` and `rollout.capacity=0` to the largest values
that fit, and the verdict (a paged engine's pool and its slots: `locoexp.planner.pages`). It
reads sub-configs and scalars, never the root config, and never allocates.

Where the fit is checked: on an accelerator each device has its own memory
(`hardware.memory_per_device_gib`), so each role's per-device peak must fit it. Colocated roles
(co, single_controller) share a device: the train step also holds the engine's weight replica,
and generation also holds the trainer's params and AdamW state; activations and the KV cache
are freed between phases. With `hardware=cpu` every host is a process on this one machine, so
their sum must fit the machine's memory: a `da` trainer host and three light rollout hosts are
not four equal shares (90% of it: the rest is left to the OS). Each local process also holds
the JAX runtime, the tokenizer and its compiled programs (`PROCESS_OVERHEAD_GIB`; a bare
process with jax and locoexp imported and one program compiled peaks at 0.31 GiB RSS).
"""

import dataclasses
import math
import os

from locoexp.adapter.config import AdapterConfig, adapted_targets
from locoexp.dataset.config import DatasetConfig
from locoexp.hardware.config import HardwareConfig
from locoexp.layout import Layout
from locoexp.model.config import ModelConfig
from locoexp.model.sizes import count_parameters_by_formula
from locoexp.planner import estimate
from locoexp.planner.estimate import GIB, EngineMemory, EngineShape, TrainerMemory, TrainerShape
from locoexp.planner.pages import PagePool, build_pool, paged, pool_pages
from locoexp.rollout.config import EngineKind, RolloutConfig, Scheduler
from locoexp.rollout.engine import padded_prompt_tokens
from locoexp.rollout.sharding import resolve_expert_parallel
from locoexp.trainer.config import TrainerConfig

PROCESS_OVERHEAD_GIB = 0.5
SHARED_MEMORY_USABLE = 0.9  # of a CPU machine's memory; the rest for the OS and page cache
# Ray's object store of a local da run (`object_store_bytes`). A new version is put while the
# rollout hosts still hold the one their engines were loaded from (their zero-copy views pin it
# until the next load): two at once, and room for one more, as the store's allocator spreads
# over freed space before it reuses it.
OBJECT_STORE_VERSIONS = 3
OBJECT_STORE_HEADROOM = 256 * 2**20  # the rollout batches and results that pass through it
OBJECT_STORE_MINIMUM = 78_643_200  # Ray refuses a smaller store (OBJECT_STORE_MINIMUM_MEMORY_BYTES)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """The resolved shapes, both estimates and the verdict's inputs (bytes)."""

    trainer_shape: TrainerShape
    engine_shape: EngineShape
    trainer: TrainerMemory
    engine: EngineMemory
    trainer_peak: int  # the training step, plus the engine's weights when colocated and kept
    # da: the whole replica each trainer device gathers to publish (estimate.publication_bytes),
    # held after the step beside params and AdamW state; 0 when colocated (the engine's own)
    publication: int
    engine_peak: int  # generation, plus the trainer's params and AdamW state when colocated
    engines: int
    replicas_per_engine: int
    requests_per_engine: int
    capacity: int  # sequences per engine per wave (rollout.capacity resolved)
    waves: int
    machine_total: int  # hardware=cpu: all local processes together; else 0
    pool: PagePool | None = None  # rollout.kv_cache=paged: the pool in place of the dense cache

    @property
    def trainer_devices(self) -> int:
        return self.trainer_shape.devices


def machine_memory_gib() -> float:
    """This machine's physical memory, from the OS."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def _next_power_of_two(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


def trainer_row_tokens(dataset: DatasetConfig, trainer: TrainerConfig) -> int:
    """The packed row length L the trainer uses (what locoexp.main passes to packing)."""
    caps = dataset.max_prompt_tokens + dataset.max_new_tokens
    return trainer.row_tokens or -(-caps // 8) * 8


def _trainer_shape(
    dataset: DatasetConfig,
    trainer: TrainerConfig,
    *,
    devices: int,
    micro: int,
    kl: bool,
    adapter_parameters: int = 0,
    adapter_saved_parameters: int = 0,
    adapter_rank_per_block: int = 0,
    expert_parallel: int = 1,
) -> TrainerShape:
    """At the caps a row holds floor(L / (P + R)) sequences (packing cannot do better in the
    worst case), and packing rounds rows per device up to a power of two. The paper's layout
    at `dataset.mean_sequence_tokens` (`_real_rows`) packs the real batch instead."""
    sequences = dataset.prompts_per_step * dataset.samples_per_prompt
    row_tokens = trainer_row_tokens(dataset, trainer)
    per_row = max(row_tokens // (dataset.max_prompt_tokens + dataset.max_new_tokens), 1)
    rows = _next_power_of_two(math.ceil(math.ceil(sequences / per_row) / devices))
    if not trainer.accumulate and dataset.mean_sequence_tokens:
        real = min(dataset.mean_sequence_tokens, dataset.max_prompt_tokens + dataset.max_new_tokens)
        rows = min(rows, _real_rows(sequences * real, row_tokens, devices))
    return TrainerShape(
        devices=devices,
        rows=rows,
        row_tokens=row_tokens,
        micro_batch_rows=min(micro, rows),
        loss_slots=math.ceil(sequences * dataset.max_new_tokens / devices),
        logit_chunk=trainer.logit_chunk_tokens,
        attention=trainer.attention,
        attention_block=trainer.attention_block_tokens,
        remat=trainer.remat,
        kl_reference=kl,
        adapter_parameters=adapter_parameters,
        adapter_saved_parameters=adapter_saved_parameters,
        adapter_rank_per_block=adapter_rank_per_block,
        expert_parallel=expert_parallel,
    )


def _real_rows(tokens: int, row_tokens: int, devices: int) -> int:
    """Rows per device of the paper's trainer layout over a batch of `tokens` real tokens: the
    paper's hosts pack each step's sequences at their real lengths into rows of L and agree on
    K padded rows per device (Algorithm 1, line 4), so the step compiles at the real batch,
    not at the caps (Section 4.2: the whole packed batch must fit at once). Packing is taken
    as tight (first-fit-decreasing of thousands of sequences wastes little of a row). locoexp's
    own packer rounds K up to a power of two (compiled shapes reused across steps): a locoexp
    run of such a batch may hold up to twice these rows."""
    return max(math.ceil(tokens / devices / row_tokens), 1)


def _engine_shape(
    model: ModelConfig,
    dataset: DatasetConfig,
    rollout: RolloutConfig,
    *,
    sequences: int,
    requests: int,
    expert_parallel: int = 1,
) -> EngineShape:
    jax_engine = rollout.engine is EngineKind.jax
    continuous = jax_engine and rollout.scheduler is Scheduler.continuous
    return EngineShape(
        tensor_parallel=rollout.tensor_parallel,
        sequences_per_replica=sequences,
        prompt_tokens=padded_prompt_tokens(dataset.max_prompt_tokens, rollout),
        new_tokens=dataset.max_new_tokens,
        prefill_chunk=rollout.prefill_chunk_tokens,
        dtype=rollout.param_dtype or model.param_dtype,
        continuous_requests=requests if continuous else 0,
        expert_parallel=expert_parallel,
        page_tokens=rollout.page_tokens if jax_engine and paged(rollout) else 0,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setup:
    """Everything a plan reads, so candidate sizes can be tried without repeating arguments."""

    model: ModelConfig
    hardware: HardwareConfig
    rollout: RolloutConfig
    dataset: DatasetConfig
    trainer: TrainerConfig
    layout: Layout  # who trains and who generates, on how many hosts
    kl_reference: bool = False  # the trainer also keeps the initial policy (algo.kl_coef > 0)
    adapter: AdapterConfig = dataclasses.field(default_factory=AdapterConfig)

    @property
    def engine_devices(self) -> int:
        return self.layout.hosts_per_engine * self.hardware.devices_per_host

    @property
    def engines(self) -> int:
        return self.layout.rollout_hosts // self.layout.hosts_per_engine

    @property
    def engine_expert_parallel(self) -> int:
        """The engine's EP degree (`rollout.expert_parallel`; 0 resolved as the engine does)."""
        replica = max(self.engine_devices // self.rollout.tensor_parallel, 1)
        return resolve_expert_parallel(self.model, self.rollout.expert_parallel, replica)

    @property
    def replicas(self) -> int:
        tp, ep = self.rollout.tensor_parallel, self.engine_expert_parallel
        return max(self.engine_devices // (tp * ep), 1)

    @property
    def requests_per_engine(self) -> int:
        """The busiest engine's: ceil(B / engines) whole groups (`phases.host_shares`)."""
        d = self.dataset
        return math.ceil(d.prompts_per_step / self.engines) * d.samples_per_prompt


def build_plan(setup: Setup, *, micro: int, per_replica: int) -> Plan:
    """The plan at `micro` rows per micro-batch and `per_replica` sequences per engine replica."""
    m, r = setup.model, setup.layout
    tshape = _trainer_shape(
        setup.dataset,
        setup.trainer,
        devices=r.trainer_hosts * setup.hardware.devices_per_host,
        micro=micro,
        kl=setup.kl_reference,
        adapter_parameters=setup.adapter.count_parameters(m),
        adapter_saved_parameters=setup.adapter.count_saved(m),
        adapter_rank_per_block=setup.adapter.rank * len(adapted_targets(setup.adapter, m))
        if setup.adapter.trains_adapters
        else 0,
        expert_parallel=setup.trainer.expert_parallel,
    )
    eshape = _engine_shape(
        m,
        setup.dataset,
        setup.rollout,
        sequences=per_replica,
        requests=setup.requests_per_engine,
        expert_parallel=setup.engine_expert_parallel,
    )
    trainer = estimate.estimate_trainer(m, count_parameters_by_formula(m), tshape)
    pool = None
    if eshape.page_tokens:
        eshape, pool = _page_pool(setup, eshape, trainer)
    engine = estimate.estimate_engine(m, eshape)
    # Table H2: with rollout.release_weights_during_training the engine's copy is freed for
    # the train step (the KV cache is per wave, freed after generation either way)
    held = r.colocated and not setup.rollout.release_weights_during_training
    trainer_peak = trainer.total + (engine.weights if held else 0)
    publication = 0 if r.colocated else estimate.publication_bytes(m, eshape.dtype)
    after_step = trainer.resident + trainer.merged + publication  # merged: adapter=lora
    trainer_peak = max(
        trainer_peak, after_step + (engine.weights if held and trainer.merged else 0)
    )
    engine_peak = engine.total + (trainer.resident if r.colocated else 0)
    capacity = min(per_replica * setup.replicas, setup.requests_per_engine)
    return Plan(
        trainer_shape=tshape,
        engine_shape=eshape,
        trainer=trainer,
        engine=engine,
        trainer_peak=trainer_peak,
        publication=publication,
        engine_peak=engine_peak,
        engines=setup.engines,
        replicas_per_engine=setup.replicas,
        requests_per_engine=setup.requests_per_engine,
        capacity=capacity,
        waves=-(-setup.requests_per_engine // capacity),
        machine_total=machine_total(setup, trainer_peak, engine_peak, publication),
        pool=pool,
    )


def _page_pool(
    setup: Setup, shape: EngineShape, trainer: TrainerMemory
) -> tuple[EngineShape, PagePool]:
    """A paged engine's shape with its pool (planner/pages.py): on an accelerator a null pool
    takes what each device has left beside the engine's weights and transients (and a
    colocated device's trainer params and AdamW state) at these slots."""
    m, hw = setup.model, setup.hardware
    page_bytes = setup.rollout.page_tokens * estimate.kv_bytes_per_token(m, shape)
    spare = None
    if not shared_memory(hw):
        bare = estimate.estimate_engine(m, shape)  # pool_pages=0: no pool yet
        held = trainer.resident if setup.layout.colocated else 0
        room = capacity_bytes(hw) - bare.weights - bare.outputs - held
        spare = room - max(bare.prefill, bare.decode)
    pages = pool_pages(
        setup.rollout,
        per_replica=shape.sequences_per_replica,
        row_tokens=shape.prompt_tokens + shape.new_tokens,
        spare_bytes=spare,
        page_bytes=page_bytes,
    )
    pool = build_pool(setup.rollout, setup.dataset, pages=pages, page_bytes=page_bytes)
    return dataclasses.replace(shape, pool_pages=pages), pool


def machine_total(setup: Setup, trainer_peak: int, engine_peak: int, publication: int) -> int:
    """hardware=cpu: every local device's peak, every process's runtime and, under da, the
    published versions in Ray's object store, summed."""
    if not shared_memory(setup.hardware):
        return 0
    r, per_host = setup.layout, setup.hardware.devices_per_host
    overhead = int(r.local_processes * PROCESS_OVERHEAD_GIB * GIB)
    if r.colocated:
        return r.trainer_hosts * per_host * max(trainer_peak, engine_peak) + overhead
    devices = (r.trainer_hosts * trainer_peak + r.rollout_hosts * engine_peak) * per_host
    return devices + overhead + object_store_bytes(publication)


def object_store_bytes(publication: int) -> int:
    """The object store a local `da` run starts Ray with (`placement.ray.session`), sized to the
    published versions it must hold. Left at Ray's default (30% of the machine's memory) the
    store's shared memory grew by a version per step until full: a 90M-parameter model's
    float32 versions (0.36 GB each) took /dev/shm to 5.4 GB in 30 steps (experiments/LOG.md,
    session 11), memory the plan did not count and the hosts then lacked."""
    return max(OBJECT_STORE_MINIMUM, OBJECT_STORE_VERSIONS * publication + OBJECT_STORE_HEADROOM)


def shared_memory(hardware: HardwareConfig) -> bool:
    """hardware=cpu without a per-device size: every host shares this machine's memory."""
    return hardware.memory_per_device_gib is None


def capacity_bytes(hardware: HardwareConfig) -> int:
    """Bytes a plan may use: per device, or all local processes together on a CPU machine."""
    per_device = hardware.memory_per_device_gib  # None: shared (`shared_memory`)
    gib = machine_memory_gib() * SHARED_MEMORY_USABLE if per_device is None else per_device
    return int(gib * GIB)


def fits(plan: Plan, hardware: HardwareConfig) -> tuple[bool, bool]:
    """(trainer fits, engine fits) on `hardware`; a paged engine also needs a pool that holds
    one row at its caps (else that row could never finish: the engine refuses it too)."""
    limit = capacity_bytes(hardware)
    pool = plan.pool is None or plan.pool.holds_one_row_at_caps
    if shared_memory(hardware):
        ok = plan.machine_total <= limit
        return ok, ok and pool
    return plan.trainer_peak <= limit, plan.engine_peak <= limit and pool
