"""Every number `predict` takes from outside the compiled programs, in one place: the chips'
published rates, App. C's measured beta_eff, and the few constants calibrated on named paper
figures (the fit set). Each `Constant` says its value, unit, fit set and source; any paper
figure not in a fit set is a held-out prediction. No per-cell factor exists anywhere.

This module never imports jax; it holds numbers, not the equations (locoexp/analysis/predict.py).
"""

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class Constant:
    """One number the prediction uses that is not read from a compiled program."""

    value: float
    unit: str
    source: str  # where the value comes from (a paper figure, a vendor page, a fit)
    fit_set: tuple[str, ...] = ()  # the paper figures it was fitted on; empty = not fitted


@dataclasses.dataclass(frozen=True, kw_only=True)
class Chip:
    """A TPU generation's published rates, per chip; `cores` TensorCores share them."""

    name: str
    peak_bf16_flops: float  # FLOP/s per chip
    hbm_bytes_per_s: float  # per chip
    hbm_bytes: float  # per chip
    ici_bytes_per_s: float  # bidirectional, per chip
    cores: int  # TensorCores per chip, which `per_core` divides by (v5p: JAX sees one device)
    source: str

    def per_core(self, rate: float) -> float:
        return rate / self.cores


_GIB, _GB = 2.0**30, 1e9
_CLOUD = "https://docs.cloud.google.com/tpu/docs/"
CHIPS = {
    "tpu_v5e": Chip(
        name="TPU v5e", peak_bf16_flops=197e12, hbm_bytes_per_s=819 * _GB,
        hbm_bytes=16 * _GB, ici_bytes_per_s=400 * _GB, cores=1,
        source=f"{_CLOUD}v5e (197 TFLOPs bf16, 16 GB and 819 GBps HBM2, 400 GBps ICI)",
    ),
    "tpu_v5p": Chip(
        name="TPU v5p", peak_bf16_flops=459e12, hbm_bytes_per_s=2765 * _GB,
        hbm_bytes=95 * _GIB, ici_bytes_per_s=1200 * _GB, cores=2,
        source=f"{_CLOUD}v5p (459 TFLOPs bf16, 95 GiB and 2,765 GBps HBM, 1,200 GBps ICI)",
    ),
    "tpu_v6e": Chip(
        name="TPU v6e", peak_bf16_flops=918e12, hbm_bytes_per_s=1638 * _GB,
        hbm_bytes=32 * _GB, ici_bytes_per_s=800 * _GB, cores=1,
        source=f"{_CLOUD}v6e (918 TFLOPs bf16, 32 GB and 1,638 GBps HBM, 800 GBps ICI)",
    ),
    "tpu_v7x": Chip(
        name="TPU7x (Ironwood)", peak_bf16_flops=2307e12, hbm_bytes_per_s=7380 * _GB,
        hbm_bytes=192 * _GIB, ici_bytes_per_s=1200 * _GB, cores=2,
        source=f"{_CLOUD}tpu7x (2,307 TFLOPs bf16, 192 GiB HBM); its HBM (7,380 GBps) and ICI "
        "(1,200 GBps) rows were not in the excerpt read in this session",
    ),
}  # fmt: skip

# App. C: "beta_eff the measured marginal HBM rate", 3.32 TB/s on v7x, per TensorCore (0.90 of
# the chip's 7.38 TB/s over its two cores). It is also the slope through App. C's two TP1
# weight times (0.70 ms at 0.6B, 5.27 ms at 8B) against their bf16 weight bytes, so those two
# figures cannot test it: they test kappa and Q_w.
BETA_EFF = Constant(
    value=3.32e12,
    unit="B/s per TensorCore (v7x)",
    source="paper App. C, Eq. 2 and trade-off 1 (measured on v7x)",
)

# Eq. 2's kappa: the fixed per-iteration time of the decode kernels. Fitted on one figure: App.
# C's TP1 weight time of Qwen3-0.6B (0.70 ms, "0.70-5.27 ms of TP1 weight time", read as the
# smallest model of the range), less Q_w / beta_eff with Q_w the compiled decode program's
# weight bytes (1.192 GB, experiments/compiled/decode_iterations.jsonl): 0.70 - 0.359.
KAPPA_MS = Constant(
    value=0.341,
    unit="ms per decode iteration",
    source="fit: 0.70 ms - Q_w(qwen3_0_6b, TP1, XLA-TPU) / beta_eff",
    fit_set=("App. C TP1 weight time, Qwen3-0.6B: 0.70 ms",),
)

# Eq. 2's C_TP(t) as a count times a latency: the collectives XLA-TPU's compiled TP-t decode
# iteration holds (all-reduce, all-gather, ...; none at TP1), each costing ALPHA_COLLECTIVE_MS
# (they move a few KiB a row, so their time is latency, not ICI bandwidth). Fitted on one
# figure: App. C's TP2 penalty at 0.6B (0.68 ms) over the collectives of Qwen3-0.6B's compiled
# TP2 iteration. The 4B penalty (0.77-0.85 ms) is held out.
ALPHA_COLLECTIVE_MS = Constant(
    value=0.68 / 69,  # 69 collectives: qwen3_0_6b TP2, decode_iterations.jsonl
    unit="ms per collective of a decode iteration",
    source="fit: 0.68 ms / the collectives of qwen3_0_6b's TP2 iteration (XLA-TPU)",
    fit_set=("App. C TP2 penalty, Qwen3-0.6B: 0.68 ms",),
)

CALIBRATED = {"kappa_ms": KAPPA_MS, "alpha_collective_ms": ALPHA_COLLECTIVE_MS}


def fit_set() -> set[str]:
    """Every paper figure some calibrated constant was fitted on."""
    return {figure for c in CALIBRATED.values() for figure in c.fit_set}


# Eq. 3's per-request admission cost of a LoCoJAX host (alpha0 folded in): App. C trade-off 2,
# "each of the 16 LoCoJAX hosts admits its own 128 requests ... in under 0.06 s" (an upper
# bound, taken as the value).
ADMISSION_S_PER_REQUEST = Constant(
    value=0.06 / 128,
    unit="s per request admitted by one host",
    source="paper App. C trade-off 2 / Figure 7a: 128 requests in under 0.06 s",
    fit_set=("App. C admission: 128 requests per host in under 0.06 s",),
)

# The step model's unknowns (locoexp/analysis/step.py), fitted together by
# `table3.fit_step_constants` (least squares of log(predicted / paper)) on six of Table 3's
# LoCoJAX base cells: each workload's smallest and largest slice (table3.FIT_SET). phi is a
# workload's mean completion over its response cap (the paper gives no lengths); host_s the
# per-step time outside the device programs. MFU is not identifiable from those cells (training
# is at most 3% of any fitted step): it is stated, not fitted, and refitting the others at 0.5
# instead moves no Table 3 cell by more than 1%.
_TABLE_3_FIT = (
    "Table 3 LoCoJAX base: GSM8K 8 and 64 chips (5.56, 2.69 s), NuminaMath 8 and 64 (154.7, "
    "28.4 s), SWE 16 and 64 (64.2, 19.2 s)",
)
MFU = Constant(
    value=0.3,
    unit="fraction of peak bf16 FLOP/s (prefill and training)",
    source="assumed (not identifiable from Table 3, see above)",
)
HOST_S = Constant(
    value=0.932, unit="s per step", source="fit: table3.fit_step_constants", fit_set=_TABLE_3_FIT
)
PHI = {
    workload: Constant(
        value=value,
        unit="mean completion tokens / dataset.max_new_tokens",
        source="fit: table3.fit_step_constants",
        fit_set=_TABLE_3_FIT,
    )
    for workload, value in (("gsm8k", 0.292), ("numinamath_cot", 0.655), ("swe_agent", 0.663))
}
CALIBRATED |= {
    "admission_s_per_request": ADMISSION_S_PER_REQUEST,
    "host_s": HOST_S,
    **{f"phi {w}": c for w, c in PHI.items()},
}
