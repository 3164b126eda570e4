"""Every program a run's roles execute, compiled for its devices without allocating anything.

`compile_programs` builds the run's trainer and one rollout engine abstractly (`nnx.eval_shape`
models, ShapeDtypeStruct state placed on the run's own meshes: `Trainer(abstract=True)`,
`JaxEngine(abstract=True)`) on the devices it is given, a TPU topology's without a TPU
(`topology.py`), and lowers and compiles with the run's own code paths:

- trainer: the train step at the plan's packed shapes and micro-batches (`train_step`), the
  weight publication's gather into a replica in the sampler's dtype (`publish`, what co's load
  and da's object-store put start from; `placement/multihost.replicate`), and under
  `adapter=lora` the merge of the adapters into the policy (`lora_merge`);
- engine: the first fill of its slots (`prefill`, chunked), the decode loop (`decode`; with
  continuous batching the loop that refills freed slots, and `compact`, the narrowing).

A mixture-of-experts model's expert-parallel layers are inside the step and the engine's
programs, on their own mesh axes. Each program reports XLA's argument, output, alias and
temporary bytes per device (`ProgramMemory`). It never runs a program.
"""

import dataclasses
import hashlib
import math
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from locoexp.adapter.config import AdapterConfig
from locoexp.algo.config import AlgoConfig
from locoexp.layout import Layout
from locoexp.model.config import ModelConfig
from locoexp.model.transformer import Transformer, blocks_scan
from locoexp.placement.multihost import replicator
from locoexp.planner.plan import Plan
from locoexp.rollout import decode, scheduling
from locoexp.rollout.config import EngineKind, RolloutConfig, SamplingParams, Scheduler
from locoexp.rollout.engine import JaxEngine, wave_rows
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.trainer import Trainer, trainer_mesh


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
    """XLA's buffer assignment of one compiled program, bytes per device."""

    role: str  # "trainer" or "engine"
    name: str
    argument: float
    output: float
    alias: float  # donated inputs reused as outputs
    temp: float
    seconds: float  # compile time
    # XLA-TPU's own peak of the program's buffers in HBM (`peak_memory_in_bytes`, arguments
    # included); 0 where the compile was not for a TPU. XLA-TPU's `temp_size_in_bytes` is not
    # the heap it lays out: Qwen3-0.6B's GSM8K train step on v7x (8 chips, 28 layers) reports
    # 72.0 GiB of temporaries where its buffer assignment lays out a 50.4 GiB heap and the
    # peak reads 49.7, and XLA-TPU compiles SWE's 16-chip step whose temporaries read 100.5
    # GiB on a 94.75 GiB device (experiments/LOG.md, session 26). On CPU the temporaries are
    # one buffer the runtime allocates whole, so they stay the figure there.
    peak: float = 0.0
    flops: float = 0.0  # XLA's cost analysis, per device
    bytes_accessed: float = 0.0
    # XLA-TPU's own refusal when the program cannot fit the device ("Ran out of memory on HBM,
    # the total memory required for HLO temporaries (36.10G) exceeds available HBM (15.75G)");
    # `temp` then holds the figure it names
    refusal: str | None = None

    @property
    def footprint(self) -> float:
        """What the program holds at its peak: XLA-TPU's peak where it gives one, else
        arguments, outputs not aliased and temporaries."""
        return self.peak or self.argument + self.output - self.alias + self.temp


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunShapes:
    """What the compile takes from the run: its sub-configs at the plan's resolved sizes."""

    model: ModelConfig
    algo: AlgoConfig
    trainer: TrainerConfig  # micro_batch_rows resolved
    rollout: RolloutConfig  # capacity resolved
    adapter: AdapterConfig
    sampling: SamplingParams
    max_new_tokens: int
    layout: Layout
    devices_per_host: int
    plan: Plan


_OUT_OF_MEMORY = re.compile(r"Ran out of memory[^(]*\(([\d.]+)([KMGT])\)")


def _refused(role: str, name: str, error: Exception, seconds: float) -> ProgramMemory:
    """XLA's out-of-memory refusal as a program whose temporaries are the figure it names."""
    match = _OUT_OF_MEMORY.search(str(error))
    if match is None:
        raise error
    value, unit = float(match.group(1)), match.group(2)
    need = value * 1024 ** "KMGT".index(unit) * 1024
    sentence = next(line for line in str(error).splitlines() if "Ran out of memory" in line)
    return ProgramMemory(role, name, 0.0, 0.0, 0.0, need, seconds, refusal=sentence.strip())


# (role, name, the lowered module's digest, the devices) -> XLA's figures, in this process: a
# program met again with the same module on the same devices is not compiled again (a refusal's
# proposal that changes only the trainer reuses the engine's programs; so do a sweep's jobs that
# differ only in what one role reads). Its `seconds` then read 0: no compile was spent.
_SEEN: dict[tuple, ProgramMemory] = {}


def _compiled(role: str, name: str, lower, mesh: jax.sharding.Mesh) -> ProgramMemory:
    begin = time.perf_counter()
    lowered = lower()
    devices = tuple((d.platform, d.device_kind, d.id) for d in mesh.devices.flat)
    key = (role, name, hashlib.sha256(lowered.as_text().encode()).hexdigest(), devices)
    if key in _SEEN:
        return dataclasses.replace(_SEEN[key], seconds=0.0)
    _SEEN[key] = _compile(role, name, lowered, begin, tpu=devices[0][0] == "tpu")
    return _SEEN[key]


def _compile(role: str, name: str, lowered, begin: float, *, tpu: bool) -> ProgramMemory:
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as error:  # XLA-TPU refuses what exceeds the device
        return _refused(role, name, error, time.perf_counter() - begin)
    seconds = time.perf_counter() - begin
    m = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    return ProgramMemory(
        role=role,
        name=name,
        argument=m.argument_size_in_bytes,
        output=m.output_size_in_bytes,
        alias=m.alias_size_in_bytes,
        temp=m.temp_size_in_bytes,
        seconds=seconds,
        peak=float(m.peak_memory_in_bytes) if tpu else 0.0,
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
    )


def abstract_model(config: ModelConfig) -> Transformer:
    return nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))


def role_devices(shapes: RunShapes, devices: list) -> tuple[list, list]:
    """(trainer devices, one engine's devices): the trainer hosts' devices, and the first
    rollout host's engine (host 0's under co, the whole slice on a single controller)."""
    r, per_host = shapes.layout, shapes.devices_per_host
    trainer = devices[: r.trainer_hosts * per_host]
    first = 0 if r.colocated else r.trainer_hosts * per_host
    return trainer, devices[first : first + r.hosts_per_engine * per_host]


def build_trainer(shapes: RunShapes, model: ModelConfig, devices: list) -> Trainer:
    return Trainer(
        abstract_model(model),
        shapes.algo,
        shapes.trainer,
        mesh=trainer_mesh(devices, shapes.trainer.expert_parallel),
        temperature=shapes.sampling.temperature,
        max_new_tokens=shapes.max_new_tokens,
        adapter=shapes.adapter,
        abstract=True,
    )


def build_engine(shapes: RunShapes, model: ModelConfig, devices: list) -> JaxEngine:
    return JaxEngine(
        abstract_model(model), shapes.rollout, eos_id=0, pad_id=0, devices=devices, abstract=True
    )


def trainer_programs(shapes: RunShapes, trainer: Trainer) -> list[ProgramMemory]:
    t, devices = shapes.plan.trainer_shape, trainer.devices
    batch = trainer.abstract_batch(t.rows * devices, t.row_tokens, t.loss_slots * devices)
    out = [_compiled("trainer", "train_step", lambda: trainer.lower_step(batch), trainer.mesh)]
    dtype = jnp.dtype((shapes.rollout.param_dtype or shapes.model.param_dtype).value)
    if shapes.adapter.trains_adapters:
        out.append(_compiled("trainer", "lora_merge", trainer.lower_merge, trainer.mesh))
        policy = trainer.policy_shapes
    else:
        policy = trainer.trainable
    publish = lambda: replicator(trainer.mesh, dtype).lower(policy)  # noqa: E731
    out.append(_compiled("trainer", "publish", publish, trainer.mesh))
    return out


def _abstract_int32(shape: tuple[int, ...], sharding: jax.sharding.Sharding) -> jax.Array:
    """An int32 argument of `shape` for lowering, nothing allocated: jax lowers from a
    ShapeDtypeStruct wherever an array goes, which its annotations do not say."""
    return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding)  # type: ignore[return-value]


def _abstract_requests(rows: int, prompt_len: int, replicated) -> tuple[decode.Requests, Any]:
    """`rows` requests of `prompt_len` prompt slots and a PRNG key, abstract and replicated."""
    requests = decode.Requests(
        prompts=_abstract_int32((rows, prompt_len), replicated),
        prompt_lens=_abstract_int32((rows,), replicated),
        caps=_abstract_int32((rows,), replicated),
        first=_abstract_int32((), replicated),
    )
    # the key's dtype, traced: a concrete key would run on the default device, a TPU
    # topology's deviceless one under an expert mesh ("'Executable' object has no attribute
    # 'local_devices'")
    dtype = jax.eval_shape(lambda: jax.random.key(0)).dtype
    return requests, jax.ShapeDtypeStruct((), dtype, sharding=replicated)


def engine_lowerings(shapes: RunShapes, engine: JaxEngine) -> dict[str, Callable[[], Any]]:
    """The engine's programs at the plan's capacity, each a function lowering it (call it
    under `engine.slot_programs.traced()`): one wave (waves), or every request of the step through
    the slots (continuous) and the first compaction."""
    e, plan = shapes.plan.engine_shape, shapes.plan
    continuous = shapes.rollout.scheduler is Scheduler.continuous
    width = wave_rows(plan.requests_per_engine, plan.capacity, engine.replicas)
    requests = plan.requests_per_engine if continuous else width
    call = scheduling.Call(
        prompt_len=e.prompt_tokens,
        max_new=shapes.max_new_tokens,
        chunk=min(shapes.rollout.prefill_chunk_tokens, e.prompt_tokens),
        sampling=shapes.sampling,
    )
    slots = engine.slot_programs
    placed, key = _abstract_requests(requests, e.prompt_tokens, slots.replicated)
    static = (call, width, requests)
    widths = scheduling.slot_widths(width, engine.replicas) if continuous else [width]
    floor = widths[1] if len(widths) > 1 else 0
    start = slots.jit("start", static)
    with engine.slot_programs.traced():
        state = jax.eval_shape(start, engine.params, placed, key)
    run = slots.jit("run", (*static, floor, continuous))
    out = {
        "prefill": lambda: start.lower(engine.params, placed, key),
        "decode": lambda: run.lower(engine.params, state, placed),
    }
    if floor:
        compact = slots.jit("compact", (call, floor, requests, width))
        out["compact"] = lambda: compact.lower(*slots.compact_args(state))
    return out


def lower_decode_iteration(engine: JaxEngine, call: scheduling.Call, rows: int) -> Any:
    """One decode iteration of `rows` rows on one replica (`decode.iteration`: `run`'s loop body
    alone, because XLA's cost analysis counts a while loop's body once whatever its trip
    count), lowered from abstract arguments: the program whose cost analysis
    tools/bench_paged_tpu_bytes.py and tools/compile_decode_iterations.py read."""
    slots = engine.slot_programs
    requests, key = _abstract_requests(rows, call.prompt_len, slots.replicated)
    static = (call, rows, rows)
    with engine.slot_programs.traced():
        state = jax.eval_shape(slots.jit("start", static), engine.params, requests, key)
        return slots.jit("iteration", static).lower(engine.params, state, requests)


def engine_programs(shapes: RunShapes, engine: JaxEngine) -> list[ProgramMemory]:
    """The engine's programs (`engine_lowerings`) compiled."""
    with engine.slot_programs.traced():
        return [
            _compiled("engine", name, lower, engine.mesh)
            for name, lower in engine_lowerings(shapes, engine).items()
        ]


def compile_programs(
    shapes: RunShapes, devices: list, *, layers: int, roles=("trainer", "engine")
) -> list[ProgramMemory]:
    """Every program of `roles` (the run's trainer and one engine), with the model cut to
    `layers` layers (the caller fits the per-layer growth, `compiled/verdict.py`)."""
    model = dataclasses.replace(shapes.model, num_layers=layers)
    trainer_devices, engine_devices = role_devices(shapes, devices)
    out = []
    if "trainer" in roles:
        out += trainer_programs(shapes, build_trainer(shapes, model, trainer_devices))
    if "engine" in roles and compiles_engine(shapes.rollout):
        out += engine_programs(shapes, build_engine(shapes, model, engine_devices))
    return out


def trainer_scans(shapes: RunShapes) -> bool:
    """Whether the train step runs the model's blocks as one scan (`transformer.blocks_scan`)."""
    return blocks_scan(abstract_model(shapes.model).layers, shapes.trainer.remat)


def compiles_engine(rollout: RolloutConfig) -> bool:
    """The built-in engine's programs are locoexp's to compile; `rollout=vllm` runs vLLM's (or
    tpu-inference's) own, which only that engine builds: its memory stays the plan's."""
    return rollout.engine is EngineKind.jax


def state_bytes(tree) -> int:
    """Bytes per device of placed ShapeDtypeStructs (the largest shard of each)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shard = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += jnp.dtype(x.dtype).itemsize * math.prod(shard)
    return total


def resident_bytes(shapes: RunShapes, devices: list) -> tuple[int, int]:
    """(the trainer's state, an engine's weights) per device at the full model: what stays
    alive between programs (params, AdamW moments, frozen base, KL reference; the engine's
    replica), from the same abstract state the programs compile with (`rollout=vllm`: the
    plan's weights)."""
    trainer_devices, engine_devices = role_devices(shapes, devices)
    trainer = build_trainer(shapes, shapes.model, trainer_devices)
    state = (trainer.trainable, trainer.opt_state, trainer.frozen, trainer.reference)
    if not compiles_engine(shapes.rollout):  # vLLM's weights: the plan's figure
        return state_bytes(state), shapes.plan.engine.weights
    engine = build_engine(shapes, shapes.model, engine_devices)
    return state_bytes(state), state_bytes(engine.params)
