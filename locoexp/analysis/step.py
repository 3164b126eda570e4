"""A colocated cell's whole step predicted from its compiled decode iteration (issue 41 item 3):
Eq. 4's lambda_co = D_R(H) + D_T(H) + d_pub, with Eq. 3's admission in front.

- D_R: per engine replica (every replica alike; the slowest host's straggle is not modelled),
  prefill plus decode. Decode runs `iterations` of Eq. 2's fixed part (kappa + Q_w / (t beta_eff)
  + C_TP(t)) plus the cache reads of every row's life: a row of prompt p that generates c tokens
  reads p + i cached tokens at its i-th iteration. The longest row of a wave reaches the cap
  (assumed: thousands of samples a step, Table 1's caps); with continuous batching the slots
  then take the replica's remaining requests, each adding c / slots iterations. c = phi x cap,
  phi the workload's mean completion share: the policy's lengths are not in the paper, so phi
  is a calibrated constant per workload (constants.PHI).
- prefill and D_T: the compiled iteration's FLOPs per row are one token's forward (XLA), and
  the difference between its two compiled cache lengths gives attention's FLOPs per cached
  token; a token at context i costs the forward plus i of those. Prefill is that per prompt
  token, training TRAIN_PASSES of it per trained token (forward, backward twice the forward,
  and the block remat's second forward), both over the core's peak times one MFU
  (constants.MFU, fitted with Table F1's trainer-bound split).
- requests: each rollout host's own per-request work (reward, detokenising, packing; Eq. 3's
  alpha1 n form), constants.REQUEST_S per request it holds.
- d_pub: the engine's weights gathered over ICI into each core (chip table).
- host: one per-step constant (constants.HOST_S) for what runs outside the device programs
  (reward, packing, logging, vLLM's weight load d_L, the host side of publication): the
  levers O1-O4 act there, so the optimized arm is predicted as the base arm.
- admission: Eq. 3 per host, alpha1 from App. C's 128 requests in under 0.06 s.
This module never imports jax.
"""

import dataclasses
import math

from locoexp.analysis.constants import (
    ADMISSION_S_PER_REQUEST,
    BETA_EFF,
    CHIPS,
    HOST_S,
    MFU,
    PHI,
    REQUEST_S,
)
from locoexp.analysis.predict import CellShape, DecodeFigures, engine_replicas, predict_iteration

TRAIN_PASSES = 4  # forward + backward (2 forwards) + remat's recomputed forward (remat: block)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepShape:
    """A co cell's step: its engine shape (`CellShape`) and what the step around it needs."""

    engine: CellShape
    workload: str
    max_new_tokens: int
    requests_per_replica: int
    continuous: bool
    requests: int
    hosts: int  # the hosts that admit requests (rollout hosts; co: every host)
    cores: int  # trainer devices (co: every device of the slice)
    replicas_per_host: int = 0  # engine replicas a rollout host runs (table_f1.da_shape)
    max_rows: int = 0  # the most rows a replica holds at a time (0: no cap)


def step_shape(engine: CellShape, config) -> StepShape:
    d, r, layout = config.dataset, config.rollout, config.layout
    replicas, most = engine_replicas(config)
    requests = d.prompts_per_step * d.samples_per_prompt
    return StepShape(
        engine=engine, workload=d.kind.value, max_new_tokens=d.max_new_tokens,
        requests_per_replica=math.ceil(requests / replicas),
        continuous=r.engine.value == "vllm" or r.scheduler.value == "continuous",
        requests=requests, hosts=layout.rollout_hosts,
        cores=layout.trainer_hosts * layout.devices_per_host,
        replicas_per_host=replicas // layout.rollout_hosts, max_rows=most,
    )  # fmt: skip


def row_flops(figures: DecodeFigures, tokens: float) -> float:
    """One forward over a row of `tokens`, whole model: each token's forward (the compiled
    iteration's FLOPs per row, times its TP) plus attention, a token at context i reading i
    cached tokens (XLA's FLOPs per cached token)."""
    token = figures.xla_flops / figures.rows * figures.tp
    return tokens * token + figures.xla_flops_per_cached_token * figures.tp * tokens * tokens / 2


def compute_s(flops: float, cores: int, mfu: float) -> float:
    """Seconds for `flops` spread over `cores` v7x TensorCores at `mfu` of their bf16 peak."""
    chip = CHIPS["tpu_v7x"]
    return flops / cores / (chip.per_core(chip.peak_bf16_flops) * mfu)


def publish_s(figures: DecodeFigures) -> float:
    """The engine's weights (all TP shards) gathered over ICI into each core."""
    chip = CHIPS["tpu_v7x"]
    return figures.weight_bytes * figures.tp / chip.per_core(chip.ici_bytes_per_s / 2)


def decode_iterations(shape: StepShape, completion: float) -> float:
    """Iterations of one replica: every wave to the cap, or (continuous) the cap plus the
    iterations the slots take for the requests beyond them."""
    cap, slots, n = shape.max_new_tokens, shape.engine.rows, shape.requests_per_replica
    if not shape.continuous:
        return shape.engine.waves * cap
    return cap + max(0, n - slots) * completion / slots


def predict_step(
    shape: StepShape,
    figures: DecodeFigures,
    *,
    phi: float,
    mfu: float,
    host_s: float,
    request_s: float,
) -> dict:
    """Each phase's seconds and the step (Eq. 4's lambda_co plus Eq. 3's admission), unrounded
    (the fit differentiates it)."""
    e, cap = shape.engine, shape.max_new_tokens
    completion = phi * cap
    fixed = predict_iteration(figures, rows=0, cached_tokens=0.0)  # kappa + weights + C_TP
    fixed_ms = fixed.kappa_ms + fixed.weight_ms + fixed.tp_ms
    iterations = decode_iterations(shape, completion)
    row_reads = e.prompt_tokens * completion + completion * (completion - 1) / 2
    kv_s = shape.requests_per_replica * row_reads * figures.kv_bytes_per_token / BETA_EFF.value
    trained = TRAIN_PASSES * shape.requests * row_flops(figures, e.prompt_tokens + completion)
    phases = {
        "admission": ADMISSION_S_PER_REQUEST.value * shape.requests / shape.hosts,  # Eq. 3
        "requests": request_s * shape.requests / shape.hosts,  # Eq. 3's alpha1 n, host side
        "prefill": compute_s(
            shape.requests_per_replica * row_flops(figures, e.prompt_tokens), e.tp, mfu
        ),
        "decode": iterations * fixed_ms / 1e3 + kv_s,
        "train": compute_s(trained, shape.cores, mfu),
        "publish": publish_s(figures),
        "host": host_s,
    }
    return {"iterations": iterations, **phases, "step": sum(phases.values())}


def calibrated(workload: str) -> dict[str, float]:
    """predict_step's constants as calibrated in constants.py."""
    return dict(phi=PHI[workload].value, mfu=MFU.value, host_s=HOST_S.value,
                request_s=REQUEST_S.value)  # fmt: skip


def predict_cell_step(shape: StepShape, figures: DecodeFigures) -> dict:
    """`predict_step` with the calibrated constants of constants.py."""
    return predict_step(shape, figures, **calibrated(shape.workload))
