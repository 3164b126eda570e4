"""Resolve the sizes left to the plan, refuse what does not fit, and write the dry-run report.

`resolve_plan` turns `trainer.micro_batch_rows=0` into the most rows per micro-batch that fit
(on a shared CPU machine, also within `CPU_MICRO_BATCH_ACTIVATIONS_GIB` of activations)
and `rollout.capacity=0` into the most sequences per engine that fit, balanced over the waves
that capacity implies (Appendix E: two waves at 8 chips; Table H1: m x DP sequences per wave);
under `rollout.kv_cache=paged` the most whose expected rows the page pool holds (planner/pages.py).
`check_fit` refuses a TP degree that does not divide the heads or the devices, and a role that
does not fit, in one sentence that names settings which do fit. It never allocates.
"""

import dataclasses
from collections.abc import Mapping

from locoexp.errors import ConfigError, require
from locoexp.hardware.config import HardwareConfig
from locoexp.layout import PlacementKind, build_layout
from locoexp.model.config import DType, ModelConfig
from locoexp.model.sizes import count_parameters_by_formula
from locoexp.planner.estimate import GIB
from locoexp.planner.pages import pool_origin
from locoexp.planner.paper import paper_workaround
from locoexp.planner.plan import (
    Plan,
    Setup,
    build_plan,
    capacity_bytes,
    fits,
    shared_memory,
)
from locoexp.rollout import sharding
from locoexp.trainer.config import AttentionKind, RematPolicy, TrainerConfig

# hardware=cpu: a micro-batch stops growing once its activations would pass this. On a CPU a
# micro-batch of a few thousand tokens already runs its matmuls at full rate, while every further
# row costs memory that the machine's other processes share: at Table 1's caps on tiny_qwen
# (8 rows of 2,560 tokens), one micro-batch of 8 rows compiles to 2.9 GiB of temporaries and the
# train step alone peaks at 4.1 GB RSS; 2 rows compile to 1.0 GiB, for one extra forward of the
# decoder body (trainer/micro.py), about 5% of that step's FLOPs (experiments/LOG.md,
# 2026-12-01). Small runs (the default run, W1) stay in one micro-batch.
CPU_MICRO_BATCH_ACTIVATIONS_GIB = 1.0


def valid_tensor_parallel(model: ModelConfig, engine_devices: int) -> list[int]:
    """TP degrees that split the query heads evenly, tile an engine's devices and divide (or
    are a multiple of) the KV heads (locoexp/rollout/sharding.py)."""
    kv = model.num_kv_heads
    return [
        t
        for t in range(1, engine_devices + 1)
        if model.num_heads % t == 0
        and engine_devices % t == 0
        and (kv % t == 0 if t <= kv else t % kv == 0)
    ]


def check_tensor_parallel(setup: Setup) -> None:
    """Refuse a rollout TP degree that does not divide the heads or the engine's devices."""
    t, heads, devices = setup.rollout.tensor_parallel, setup.model.num_heads, setup.engine_devices
    valid = ", ".join(map(str, valid_tensor_parallel(setup.model, devices)))
    require(
        heads % t == 0,
        f"rollout.tensor_parallel={t} does not divide model.num_heads={heads} "
        f"({setup.model.name}): valid TP degrees for {devices} devices per engine are {valid}.",
    )
    require(
        devices % t == 0,
        f"rollout.tensor_parallel={t} does not divide the {devices} devices of a rollout "
        f"engine (hardware.chips_per_host x hardware.devices_per_chip per host): valid TP "
        f"degrees are {valid}.",
    )
    kv = setup.model.num_kv_heads
    require(
        kv % t == 0 if t <= kv else t % kv == 0,
        f"rollout.tensor_parallel={t} must divide model.num_kv_heads={kv} or be a multiple of "
        f"it (each device keeps whole KV heads): valid TP degrees are {valid}.",
    )


def check_expert_parallel(setup: Setup) -> None:
    """Refuse an EP degree the experts or the devices it splits them over cannot take: the
    engine's replica (its devices / TP) and the trainer's devices."""
    m, r = setup.model, setup.rollout
    replica = max(setup.engine_devices // r.tensor_parallel, 1)
    engine_ep = setup.engine_expert_parallel
    sharding.check_expert_parallel(m, "rollout.expert_parallel", engine_ep, replica)
    trainer_devices = setup.layout.trainer_hosts * setup.hardware.devices_per_host
    ep = setup.trainer.expert_parallel
    sharding.check_expert_parallel(m, "trainer.expert_parallel", ep, trainer_devices)


def _largest(low: int, high: int, ok) -> int | None:
    """The largest v in [low, high] with ok(v), for ok monotone (true, then false)."""
    if not ok(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if ok(mid) else (low, mid - 1)
    return low


def _worth_holding(plan: Plan, hardware: HardwareConfig) -> bool:
    """On a shared CPU machine, a micro-batch within the activation cap; else any."""
    cap = CPU_MICRO_BATCH_ACTIVATIONS_GIB * GIB
    return not shared_memory(hardware) or plan.trainer.activations <= cap


def resolve_plan(setup: Setup) -> Plan:
    """The plan with micro_batch_rows and capacity resolved to the largest values that fit
    (or as given). With shared CPU memory the trainer is sized first, at one sequence per
    replica, then the engine takes what is left."""
    hw, requests = setup.hardware, setup.requests_per_engine
    most = -(-requests // setup.replicas)
    if setup.rollout.max_sequences_per_replica:  # vLLM's max_num_seqs per DP rank
        most = min(most, setup.rollout.max_sequences_per_replica)
    fixed = setup.rollout.capacity
    if fixed:
        per_replica = -(-min(fixed, requests) // setup.replicas)
    rows = build_plan(setup, micro=1, per_replica=1).trainer_shape.rows
    micro = setup.trainer.micro_batch_rows
    if not setup.trainer.accumulate:  # the paper's layout: every row in one pass
        micro = rows
    elif not micro:
        start = per_replica if fixed else 1
        candidates = [1 << k for k in range(rows.bit_length() - 1, -1, -1)]  # rows is 2^k
        plans = (build_plan(setup, micro=m, per_replica=start) for m in candidates)
        fitting = (
            p.trainer_shape.micro_batch_rows
            for p in plans
            if fits(p, hw)[0] and _worth_holding(p, hw)
        )
        micro = next(fitting, 1)
    if not fixed:
        per_replica = most_per_replica(setup, micro=micro, most=most)
        waves = -(-requests // (per_replica * setup.replicas))
        per_wave = -(-requests // waves)
        per_replica = -(-per_wave // setup.replicas)  # balance the waves
    return build_plan(setup, micro=micro, per_replica=per_replica)


def most_per_replica(setup: Setup, *, micro: int, most: int) -> int:
    """The most sequences per engine replica, at most `most`, whose plan fits (1 if none). A
    paged engine's are also the most whose rows of the expected length its pool holds at once
    (planner/pages.py): the pool, not the caps, sets them."""

    def ok(per_replica: int) -> bool:
        plan = build_plan(setup, micro=micro, per_replica=per_replica)
        held = plan.pool is None or plan.pool.holds(per_replica)
        return fits(plan, setup.hardware)[1] and held

    return _largest(1, most, ok) or 1


def resolved_micro_batch_rows(trainer: TrainerConfig, plan: Plan) -> int:
    """What `trainer.micro_batch_rows` becomes once planned: the plan's rows per micro-batch,
    or 0 (every row in one pass) under the paper's layout (`trainer.accumulate=false`)."""
    return plan.trainer_shape.micro_batch_rows if trainer.accumulate else 0


def paper_layout(setup: Setup, *, remat: RematPolicy | None = None) -> Setup:
    """`setup` under the paper's trainer layout: no gradient accumulation, one pass over the
    per-device batch (Section 4.2); with `remat`, under that policy too."""
    trainer = {"accumulate": False, "micro_batch_rows": 0, "remat": remat or setup.trainer.remat}
    return _replace(setup, {"trainer": trainer})


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f}"


def _variants(setup: Setup, role: str) -> list[tuple[str, Setup]]:
    """Single settings that may make `role` fit, cheapest first ("machine": a CPU machine's
    local processes together, so both roles' settings)."""
    t, m, r = setup.trainer, setup.model, setup.rollout
    trainer, engine = role in ("trainer", "machine"), role in ("engine", "machine")
    out: list[tuple[str, dict[str, dict[str, object]]]] = []
    if trainer and not t.accumulate:  # locoexp's own layout: accumulate over micro-batches
        out.append(("trainer.accumulate=true", {"trainer": {"accumulate": True}}))
    if trainer and t.micro_batch_rows:
        out.append(("trainer.micro_batch_rows=0", {"trainer": {"micro_batch_rows": 0}}))
    if engine and r.capacity:
        out.append(("rollout.capacity=0", {"rollout": {"capacity": 0}}))
    if engine and r.kv_cache_pages_per_replica is not None:  # the plan's pool (planner/pages.py)
        pool: dict[str, object] = {"kv_cache_pages_per_replica": None}
        out.append(("rollout.kv_cache_pages_per_replica=null", {"rollout": pool}))
    sampler, cpu = r.param_dtype or m.param_dtype, setup.hardware.platform == "cpu"
    if trainer and t.attention is AttentionKind.dense:
        out.append(
            ("trainer.attention=blockwise", {"trainer": {"attention": AttentionKind.blockwise}})
        )
    # XLA on CPU folds remat's recomputation back into the forward pass (and offload needs a
    # device's pinned host memory): there no policy saves memory, so none is proposed
    if trainer and not cpu:
        for policy in (p for p in (RematPolicy.block, RematPolicy.offload) if p is not t.remat):
            out.append((f"trainer.remat={policy.value}", {"trainer": {"remat": policy}}))
    if m.param_dtype is DType.float32:
        out.append(("model.param_dtype=bfloat16", {"model": {"param_dtype": DType.bfloat16}}))
    if engine:
        valid = valid_tensor_parallel(m, setup.engine_devices)
        for tp in (v for v in valid if v > r.tensor_parallel):
            out.append((f"rollout.tensor_parallel={tp}", {"rollout": {"tensor_parallel": tp}}))
        # XLA on CPU holds float32 copies of a bfloat16 sampler's weights (Qwen3-0.6B: 3.63 GB
        # beside 1.19, experiments/LOG.md): there bfloat16 is no remedy, so it is not proposed
        if sampler is DType.float32 and not cpu:
            out.append(
                ("rollout.param_dtype=bfloat16", {"rollout": {"param_dtype": DType.bfloat16}})
            )
    return [(label, _replace(setup, change)) for label, change in out]


def _smaller_batches(setup: Setup) -> list[tuple[str, Setup]]:
    """Halved prompts per step, kept whole per host (co) or per rollout host (da): on a shared
    CPU machine more hosts never help, a smaller batch does."""
    roles, d = setup.layout, setup.dataset
    multiple = roles.rollout_hosts if roles.hosts_per_engine == 1 else 1
    out, prompts = [], d.prompts_per_step
    while prompts > multiple:
        prompts = max(prompts // 2 // multiple * multiple, multiple)
        change = {"dataset": {"prompts_per_step": prompts}}
        out.append((f"dataset.prompts_per_step={prompts}", _replace(setup, change)))
    return out


def _resolved(label: str, setup: Setup) -> str:
    if label == "trainer.micro_batch_rows=0":
        rows = resolve_plan(setup).trainer_shape.micro_batch_rows
        return f"trainer.micro_batch_rows={rows} (or 0, the most that fit)"
    if label == "rollout.capacity=0":
        return f"rollout.capacity={resolve_plan(setup).capacity} (or 0, the most that fit)"
    return label


def _replace(setup: Setup, change: Mapping[str, Mapping[str, object]]) -> Setup:
    parts = {k: dataclasses.replace(getattr(setup, k), **v) for k, v in change.items()}
    return dataclasses.replace(setup, **parts)


def _fits(setup: Setup) -> bool:
    try:
        check_tensor_parallel(setup)
    except ConfigError:
        return False
    return all(fits(resolve_plan(setup), setup.hardware))


def remedies(setup: Setup, role: str) -> list[str]:
    """Settings (one, or two together) under which the whole plan fits; a size left to the
    plan (0) is named with the value it resolves to."""
    variants = _variants(setup, role)
    single = [_resolved(label, v) for label, v in variants if _fits(v)]
    if single:
        return single[:3]
    pairs = [
        (f"{first} {second}", w)
        for i, (first, v) in enumerate(variants)
        for second, w in _variants(v, role)[i:]
        if second != first
    ]
    fitting = [label for label, w in pairs if _fits(w)]
    if fitting:
        return fitting[:1]
    if shared_memory(setup.hardware):  # a smaller batch, alone or after one or two variants
        candidates = [("", setup), *((f"{label} ", v) for label, v in variants + pairs)]
        for prefix, base in candidates:
            batch = next((label for label, v in _smaller_batches(base) if _fits(v)), None)
            if batch:
                return [prefix + batch]
        fewest = _fewest_hosts(setup)  # then fewer copies of the weights
        if fewest is not None:
            label, fewer = fewest
            if _fits(fewer):
                return [label]
            batch = next((b for b, v in _smaller_batches(fewer) if _fits(v)), None)
            if batch:
                return [f"{label} {batch}"]
        colocated = _colocated(setup)  # last: the placement itself, so the next command runs
        if colocated is not None:
            label, co = colocated
            fixes = [] if _fits(co) else remedies(co, role)
            if _fits(co) or fixes:
                return [" ".join([label, *fixes[:1]])]
    return []


def _colocated(setup: Setup) -> tuple[str, Setup] | None:
    """placement=da on a shared CPU machine holds the weights in every process (trainer, each
    rollout host, and the driver's object store): one colocated host holds them once (None:
    already colocated)."""
    r = setup.layout
    if r.colocated:
        return None
    layout = build_layout(PlacementKind.co, hosts=1, devices_per_host=r.devices_per_host)
    hardware = dataclasses.replace(setup.hardware, hosts=1)
    co = dataclasses.replace(setup, layout=layout, hardware=hardware)
    return "placement=co hardware.hosts=1 split=null", co


def _fewest_hosts(setup: Setup) -> tuple[str, Setup] | None:
    """On a shared CPU machine every host process holds its own copy of the weights (and under
    da its own runtime): the fewest hosts the placement runs on, one per role (None: already)."""
    r = setup.layout
    if r.trainer_hosts == 1 and (r.colocated or r.rollout_hosts == 1):
        return None
    hosts, split = (1, None) if r.colocated else (2, 0.5)
    layout = build_layout(r.kind, hosts=hosts, devices_per_host=r.devices_per_host, split=split)
    label = "hardware.hosts=1" if r.colocated else "hardware.hosts=2 split=0.5"
    hardware = dataclasses.replace(setup.hardware, hosts=hosts)
    return label, dataclasses.replace(setup, layout=layout, hardware=hardware)


def check_fit(setup: Setup, *, memory: bool = True) -> Plan:
    """The resolved plan; refuses a TP or EP degree, and (`memory`) a role that does not fit,
    naming a fix. `memory=False`: XLA's compile judges the fit (`compiled/startup.py`)."""
    check_tensor_parallel(setup)
    check_expert_parallel(setup)
    plan = resolve_plan(setup)
    trainer_ok, engine_ok = fits(plan, setup.hardware)
    if (trainer_ok and engine_ok) or not memory:
        return plan
    role = "machine" if shared_memory(setup.hardware) else "trainer" if not trainer_ok else "engine"
    fixes = remedies(setup, role)
    if fixes:
        advice = f"it fits with {' or '.join(fixes)}"
    elif shared_memory(setup.hardware):  # fewer hosts and smaller batches were tried too
        advice = (
            "no setting tried here makes it fit, fewer hosts and smaller batches included (each "
            "local host process holds its own copy of the weights): use a smaller model, lower "
            "dataset.samples_per_prompt, or run on a machine with more memory"
        )
    else:
        advice = (
            "no single setting here makes it fit: lower dataset.max_prompt_tokens and "
            "dataset.max_new_tokens, or use a larger hardware slice"
        )
    paper = paper_workaround(setup.model.name, setup.rollout.tensor_parallel, setup.hardware.chips)
    advice += f"; the paper's own workaround: {paper}" if paper else ""
    raise ConfigError(f"does not fit: {_shortfall(setup, plan, role)}; {advice}.")


def _shortfall(setup: Setup, plan: Plan, role: str) -> str:
    hw, limit = setup.hardware, capacity_bytes(setup.hardware)
    if shared_memory(hw):
        return (
            f"the {setup.layout.local_processes} local processes need "
            f"{_gib(plan.machine_total)} GiB "
            f"together of this machine's usable {_gib(limit)} (hardware=cpu hosts share its memory)"
        )
    if role == "trainer":
        t = plan.trainer_shape
        return (
            f"the trainer needs {_gib(plan.trainer_peak)} GiB per device of "
            f"{hw.memory_per_device_gib:.1f} (hardware.memory_per_device_gib) even at "
            f"{t.micro_batch_rows} row{'s' if t.micro_batch_rows > 1 else ''} of {t.row_tokens} "
            "tokens per micro-batch"
        )
    pool = plan.pool
    if pool is not None and not pool.holds_one_row_at_caps:
        return (
            f"the paged KV pool has {pool.pages} pages of rollout.page_tokens="
            f"{pool.page_tokens} per replica "
            f"({pool_origin(pool, shared=False, colocated=setup.layout.colocated)}) and one "
            f"row at its caps "
            f"({pool.caps_tokens} tokens) needs {pool.floor_pages}"
        )
    return (
        f"the rollout engine needs {_gib(plan.engine_peak)} GiB per device of "
        f"{hw.memory_per_device_gib:.1f} (hardware.memory_per_device_gib) even at "
        f"{plan.engine_shape.sequences_per_replica} sequences per replica at "
        f"rollout.tensor_parallel={setup.rollout.tensor_parallel}"
    )


def parameters_b(setup: Setup) -> float:
    return count_parameters_by_formula(setup.model) / 1e9
