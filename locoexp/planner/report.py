"""The dry-run report of a plan: hosts, devices per role, resolved sizes, memory per device.

It formats; it never resolves or refuses (that is `locoexp.planner.fit`).
"""

from locoexp.errors import ConfigError
from locoexp.model.config import RematPolicy
from locoexp.planner.estimate import GIB, TrainerShape
from locoexp.planner.fit import check_fit, paper_layout, parameters_b, resolve_plan
from locoexp.planner.pages import pool_origin
from locoexp.planner.plan import (
    OBJECT_STORE_VERSIONS,
    Plan,
    Setup,
    capacity_bytes,
    object_store_bytes,
    shared_memory,
)


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f}"


def _n(count: int, noun: str) -> str:
    plural = "es" if noun.endswith(("s", "h")) else "s"
    return f"{count} {noun}" + ("" if count == 1 else plural)


def _adapter_note(setup: Setup) -> str:
    """adapter=lora: what trains (the base is frozen: no gradients nor AdamW state for it)."""
    a = setup.adapter
    if not a.trains_adapters:
        return ""
    count, saved = a.count_parameters(setup.model), a.count_saved(setup.model)
    names = ", ".join(m.value for m in a.modules_to_save)
    full = f"{saved / 1e6:.2f}M in full: {names}; " if saved else ""
    return f"; LoRA rank {a.rank} trains {count / 1e6:.2f}M of them ({full}rest frozen)"


def _trainer_line(setup: Setup, plan: Plan) -> str:
    t, s, roles = plan.trainer, plan.trainer_shape, setup.layout
    terms = [
        f"params {_gib(t.params)}",
        f"AdamW {_gib(t.optimizer)}",
        f"gathered block {_gib(t.gathered_block)}",
        f"activations {_gib(t.activations)}",
        f"head {_gib(t.head_gradient)}",
        f"gradients {_gib(t.gradients)} + head chunk {_gib(t.head_chunk)}"
        if t.head_in_micro_batches
        else f"max(gradients, head chunk {_gib(t.head_chunk)})",
    ]
    terms += [f"KL reference {_gib(t.reference)}"] if setup.kl_reference else []
    held = roles.colocated and not setup.rollout.release_weights_during_training
    terms += [f"engine weights {_gib(plan.engine.weights)}"] if held else []
    tail = f", {_gib(t.offloaded)} GiB offloaded to host" if t.offloaded else ""
    if t.merged:  # adapter=lora: publication merges the adapters into a copy of the base
        tail += f"; after the step + the merged policy it publishes {_gib(t.merged)}"
    if plan.publication:  # da: the replica gathered to publish, after the step
        tail += (
            f"; after the step params and AdamW {_gib(t.resident)} + the replica it publishes "
            f"{_gib(plan.publication)}"
        )
    return (
        f"trainer: {_n(roles.trainer_hosts, 'host')}, {_n(s.devices, 'device')} "
        f"({_trainer_parallelism(setup, s)}), "
        f"{s.rows} rows x {s.row_tokens} tokens per device in {_n(s.micro_batches, 'micro-batch')}"
        f" of {s.micro_batch_rows} (trainer.micro_batch_rows), attention={s.attention.value}, "
        f"remat={s.remat.value}; {_gib(plan.trainer_peak)} GiB per device = "
        + " + ".join(terms)
        + tail
    )


def _trainer_parallelism(setup: Setup, s: TrainerShape) -> str:
    """FSDP, and for a mixture-of-experts model its expert parallelism."""
    if not setup.model.moe:
        return "FSDP"
    ep = s.expert_parallel
    return (
        f"FSDP{s.devices // ep} x EP{ep} (trainer.expert_parallel): "
        f"{setup.model.num_experts // ep} of {setup.model.num_experts} experts per device"
        + (" before FSDP" if ep > 1 else ", FSDP-split")
    )


def _engine_experts(setup: Setup, s) -> str:
    """A mixture-of-experts engine's EP degree, given or resolved from 0 ("EP8 (...) x ")."""
    if not setup.model.moe:
        return ""
    given = "rollout.expert_parallel"
    given += "" if setup.rollout.expert_parallel else "=0: the most that divide"
    experts = setup.model.num_experts // s.expert_parallel
    return f"EP{s.expert_parallel} ({given}; {experts} experts per device) x "


def _object_store(plan: Plan) -> str:
    if not plan.publication:
        return ""
    store = _gib(object_store_bytes(plan.publication))
    return (
        f", Ray's object store {store} GiB among them (room for {OBJECT_STORE_VERSIONS} "
        f"published versions of {_gib(plan.publication)} GiB)"
    )


def _engine_line(setup: Setup, plan: Plan) -> str:
    e, s, roles = plan.engine, plan.engine_shape, setup.layout
    kv = "KV pool" if plan.pool else "KV cache"
    terms = [
        f"weights {_gib(e.weights)}",
        f"{kv} {_gib(e.kv_cache)}",
        f"max(prefill chunk {_gib(e.prefill)}, decode logits {_gib(e.decode)}{_compaction(e)})",
        f"outputs {_gib(e.outputs)}",
    ]
    terms += [f"trainer params and AdamW {_gib(plan.trainer.resident)}"] if roles.colocated else []
    # da's rollout hosts may hold floor or ceil of B/R groups: the plan is the busiest's
    busiest = " (the busiest)" if setup.dataset.prompts_per_step % plan.engines else ""
    return (
        f"rollout: {_n(roles.rollout_hosts, 'host')}, {_n(plan.engines, 'engine')} of "
        f"{_n(setup.engine_devices, 'device')}, DP{plan.replicas_per_engine} x "
        f"{_engine_experts(setup, s)}TP{s.tensor_parallel}, {s.dtype.value} sampler; "
        f"{plan.requests_per_engine} requests per engine{busiest} {_batching(plan, s)}, "
        f"{s.sequences_per_replica} per replica; {_gib(plan.engine_peak)} GiB per device = "
        + " + ".join(terms)
    )


def _pool_line(setup: Setup, plan: Plan) -> str:
    """rollout.kv_cache=paged: the pool, where its size and the expected row come from, the
    slots they give, and what happens when rows run longer than expected."""
    pool, s = plan.pool, plan.engine_shape
    assert pool is not None, "a paged plan has a pool"
    origin = pool_origin(
        pool, shared=shared_memory(setup.hardware), colocated=setup.layout.colocated
    )
    over = s.sequences_per_replica > pool.expected_rows
    excess = (
        f"; its {s.sequences_per_replica} slots per replica exceed the {pool.expected_rows} "
        "expected rows the pool holds: expect waits and preemptions"
        if over
        else ""
    )
    return (
        f"paged KV cache (rollout.kv_cache=paged): {pool.pages} pages of {pool.page_tokens} "
        f"tokens per replica ({origin}), {_gib(pool.bytes_per_device)} GiB per device; expected "
        f"row {pool.expected_row_tokens} tokens ({pool.expected_source}), {pool.expected_row_pages}"
        f" pages: the pool holds {pool.expected_rows} such rows at once, "
        f"{pool.pages // pool.floor_pages} at the caps ({pool.caps_tokens} tokens); "
        f"{s.sequences_per_replica} slots per replica, {plan.capacity} per engine, "
        f"{_n(plan.waves, 'wave')}{excess}. The expected length is a plan, not a promise: rows "
        "longer than expected run the pool dry, and the engine then waits for pages, then "
        "preempts a row and recomputes it (vLLM's rule): slower, never out of memory"
    )


def _compaction(e) -> str:
    return f", compaction {_gib(e.compaction)}" if e.compaction else ""


def _batching(plan: Plan, shape) -> str:
    """How the engine runs its requests through its capacity (rollout.scheduler)."""
    if shape.continuous_requests:
        return (
            f"continuously batched through {plan.capacity} slots (rollout.capacity; static "
            f"waves would take {plan.waves})"
        )
    return f"in {_n(plan.waves, 'wave')} of {plan.capacity} (rollout.capacity)"


def _hardware_line(setup: Setup, hosts_note: str) -> str:
    hw = setup.hardware
    if shared_memory(hw):
        memory = (
            f"sharing 90% of this machine's memory, {_gib(capacity_bytes(hw))} GiB (from the OS)"
        )
    else:
        memory = f"{hw.memory_per_device_gib:.1f} GiB per device"
    note = f" ({hosts_note})" if hosts_note else ""
    return (
        f"hardware {hw.chip.value}: {_n(setup.layout.hosts, 'host')}{note} x "
        f"{_n(hw.devices_per_host, 'device')}, {memory}"
    )


def accumulation_note(setup: Setup, plan: Plan) -> str:
    """Empty unless a LoCoJAX plan fits only by accumulating gradients over micro-batches,
    which the paper's trainer does not (Section 4.2); then what the paper's layout would need."""
    # LoCoJAX's trainer (co, da); the single controller's (MaxText on Pathways) ran SWE at 8
    # chips where LoCoJAX's did not fit (Table 3)
    lockstep = setup.layout.hosts_per_engine > 1
    if lockstep or not setup.trainer.accumulate or plan.trainer_shape.micro_batches == 1:
        return ""
    # the least the layout needs: also with each block rematerialised (the paper's trainer's
    # remat policy is not stated; tests/test_paper_layout_memory.py sets it beside Table 3's
    # 157.6 GiB). Not offload: at the real SWE batch of 8 chips it would put 1.4 TiB per device
    # in host memory, which no v7x host has.
    layouts = [paper_layout(setup), paper_layout(setup, remat=RematPolicy.block)]
    needs = [(_need(resolve_plan(s), setup), s.trainer.remat) for s in layouts]
    need, remat = min(needs, key=lambda pair: pair[0])
    if need <= capacity_bytes(setup.hardware):
        return ""
    per = "for all local processes" if shared_memory(setup.hardware) else "per device"
    return (
        f"fits with gradient accumulation ({_n(plan.trainer_shape.micro_batches, 'micro-batch')}"
        f"); the paper's layout (trainer.accumulate=false) needs {_gib(need)} GiB {per} of "
        f"{_gib(capacity_bytes(setup.hardware))} even with trainer.remat={remat.value}"
    )


def _need(plan: Plan, setup: Setup) -> int:
    return plan.machine_total if shared_memory(setup.hardware) else plan.trainer_peak


def verdict_of(setup: Setup) -> str:
    """One sentence: fits, fits with gradient accumulation (and what the paper's layout
    would need), or the refusal."""
    try:
        plan = check_fit(setup)
    except ConfigError as error:
        return str(error)
    return accumulation_note(setup, plan) or "fits"


def describe_plan(setup: Setup, *, hosts_note: str = "") -> str:
    """The dry-run report; its last line is the verdict ("fits" or the refusal)."""
    verdict = verdict_of(setup)
    if setup.model.num_heads % setup.rollout.tensor_parallel:
        return f"model {setup.model.name}: {verdict}"
    plan = resolve_plan(setup)
    lines = [
        f"model {setup.model.name}: {parameters_b(setup):.3f}B parameters, "
        f"{setup.model.param_dtype.value}" + _adapter_note(setup),
        _hardware_line(setup, hosts_note),
        _trainer_line(setup, plan),
        _engine_line(setup, plan),
        *([_pool_line(setup, plan)] if plan.pool else []),
    ]
    if shared_memory(setup.hardware):
        lines.append(
            f"this machine: {_gib(plan.machine_total)} GiB for all "
            f"{_n(setup.layout.local_processes, 'local process')} together" + _object_store(plan)
        )
    placement = "colocated" if setup.layout.colocated else "disaggregated"
    return "\n".join([*lines, f"placement: {placement}; {verdict}"])


def summarize_plan(setup: Setup) -> str:
    """One line of a sweep's dry run: the verdict (why, in GiB per device of what, when it
    does not fit), each role's GiB per device, micro-batches and decode waves."""
    verdict = verdict_of(setup)
    if setup.model.num_heads % setup.rollout.tensor_parallel:
        return verdict
    plan = resolve_plan(setup)
    if shared_memory(setup.hardware):
        memory = f"{_gib(plan.machine_total)} GiB for all local processes"
    else:
        memory = (
            f"trainer {_gib(plan.trainer_peak)}, engine {_gib(plan.engine_peak)} GiB per device"
        )
    return (
        f"{verdict} | {memory} of {_gib(capacity_bytes(setup.hardware))}; "
        f"{_n(plan.trainer_shape.micro_batches, 'micro-batch')} of "
        f"{_n(plan.trainer_shape.micro_batch_rows, 'row')}; {_n(plan.waves, 'wave')} of "
        f"{plan.capacity} per engine"
    )
