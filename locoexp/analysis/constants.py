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
# LoCoJAX base cells (each workload's smallest and largest slice, table3.FIT_SET) and one of
# Table F1's da splits (table_f1.FIT_CELL: SWE 128 chips, 4 of 32 hosts training, 40.6 s; its
# trainer branch is F1's longest). phi is a workload's mean completion over its response cap
# (the paper gives no lengths); host_s the per-step time outside the device programs; MFU the
# trainer's (and prefill's) share of peak bf16 FLOP/s, over XLA's FLOPs of a token's forward
# plus attention over its context. Table 3 alone cannot pin MFU (the first fit stated 0.3:
# refit at 0.5, no fitted step moved 1%); F1's trainer-bound split can. GSM8K's phi runs to
# 0.028 (57 tokens of 2,048): with the per-request host time and every replica's decode at
# the cap, the fit has little left for GSM8K's completions (LOG, session 28, w41more).
_TABLE_3_FIT = (
    "Table 3 LoCoJAX base: GSM8K 8 and 64 chips (5.56, 2.69 s), NuminaMath 8 and 64 (154.7, "
    "28.4 s), SWE 16 and 64 (64.2, 19.2 s)",
    "Table F1 SWE 128 chips, da 12.5% (4/28 hosts): 40.6 s",
    "App. C fragmentation at GSM8K 8 chips: F = 2.9 s",
)
MFU = Constant(
    value=0.2623,
    unit="fraction of peak bf16 FLOP/s (prefill and training)",
    source="fit: table3.fit_step_constants (with Table F1's FIT_CELL)",
    fit_set=_TABLE_3_FIT,
)
HOST_S = Constant(
    value=0.878, unit="s per step", source="fit: table3.fit_step_constants", fit_set=_TABLE_3_FIT
)
# A rollout host's own per-request work outside the device programs (reward, detokenising,
# packing; Eq. 3's alpha1 n form, beside admission's alpha1), s per request it holds. Fitted
# with the others; its figure is App. C's fragmentation at GSM8K 8 chips, F = D_R(1 host) -
# D_R(2 hosts) = 2.9 s, which the device programs alone put at under 1 s.
REQUEST_S = Constant(
    value=0.00229, unit="s per request on its rollout host",
    source="fit: table3.fit_step_constants", fit_set=_TABLE_3_FIT,
)  # fmt: skip
PHI = {
    workload: Constant(
        value=value,
        unit="mean completion tokens / dataset.max_new_tokens",
        source="fit: table3.fit_step_constants",
        fit_set=_TABLE_3_FIT,
    )
    for workload, value in (("gsm8k", 0.0277), ("numinamath_cot", 0.633), ("swe_agent", 0.206))
}
CALIBRATED |= {
    "admission_s_per_request": ADMISSION_S_PER_REQUEST,
    "host_s": HOST_S,
    "mfu": MFU,
    "request_s": REQUEST_S,
    **{f"phi {w}": c for w, c in PHI.items()},
}

# Eq. 4's d_L and tau (App. C trade-off 4, GSM8K 128 chips: "dL a prior and tau a residual"),
# taken as stated for every Table F1 cell (all Qwen3-0.6B).
D_L_S = Constant(
    value=0.49, unit="s per step (rollout weight load under da)",
    source="paper App. C trade-off 4: d_L = 0.49 s (a prior), GSM8K 128 chips",
)  # fmt: skip
TAU_S = Constant(
    value=0.03, unit="s per step (residual Ray overhead under da)",
    source="paper App. C trade-off 4: tau = 0.03 s (a residual), GSM8K 128 chips",
)  # fmt: skip
# Eq. 4's A from a host-level straggler (table_f1.straggler_a): each rollout host's finish
# jitters by a normal spread of STRAGGLER_S seconds, the slowest of N leading the mean by
# STRAGGLER_S x E[max of N standard normals] (1.766 at N = 16). Fitted on one figure: Section
# 4.4's slowest rollout host 38% of the step behind the average at GSM8K 64 chips (16 hosts;
# co step 2.02 s, Table F1): 0.38 x 2.02 / 1.766. Its 55% at 128 chips and App. C's A = 0.58 s
# are held out.
STRAGGLER_S = Constant(
    value=0.38 * 2.02 / 1.7659913931,
    unit="s (normal spread of a rollout host's finish)",
    source="fit: Section 4.4's straggler share at GSM8K 64 chips / E[max of 16 normals]",
    fit_set=("Section 4.4: the slowest rollout host 38% of the step, GSM8K 64 chips",),
)
CALIBRATED["straggler_s"] = STRAGGLER_S
