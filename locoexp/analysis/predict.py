"""Appendix C's Eq. 2 evaluated before a run: a cell's decode iteration predicted from its
compiled decode program (issue 41).

    d_iter(t) = kappa + (Q_w / t + Q_KV) / beta_eff + C_TP(t)          (Eq. 2)

Q_w / t is the weight bytes a device of the cell's rollout TP holds in XLA-TPU's compiled
decode iteration, Q_KV the cache bytes its rows read (XLA-TPU's bytes per cached token times
the rows times the tokens in cache), C_TP(t) the compiled program's collectives times one
latency times t - 1 (a collective's steps over t devices); kappa and that latency are the
calibrated constants of `constants.py`, beta_eff App. C's measured rate. The compiled
figures come from tools/compile_decode_iterations.py's cache
(experiments/compiled/decode_iterations.jsonl): this module never imports jax and compiles
nothing. Compute is left out as Eq. 2 leaves it out (App. C: 0.02-0.24 ms at peak) and reported
beside it from XLA's FLOPs. XLA's own `bytes accessed` is reported too, as a compiler figure:
it counts VMEM copies and whole-table gathers, so it is not the bytes streamed from HBM.
"""

import dataclasses
import json
import math
from pathlib import Path

from locoexp.analysis.constants import ALPHA_COLLECTIVE_MS, BETA_EFF, CHIPS, KAPPA_MS
from locoexp.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DECODE_CACHE = ROOT / "experiments" / "compiled" / "decode_iterations.jsonl"
LENGTH_CACHE = ROOT / "experiments" / "compiled" / "length_mix.jsonl"
TOOL = "tools/compile_decode_iterations.py"
# XLA-TPU's fit verdicts of the paper's cells at the paper's layout (tools/compile_paper_cells.py)
CELL_CACHE = ROOT / "experiments" / "compiled" / "paper_cells.jsonl"


def read_fit_verdicts(path: Path = CELL_CACHE) -> dict[tuple[str, str], str]:
    """(experiment, cell) -> XLA-TPU's verdict of the cell's trainer at the paper's layout, a
    compiler figure: a step predicted for a cell that does not fit is a step no slice runs
    (Table 3's SWE at 8 chips). The newest entry of a cell wins, and one read with XLA-TPU's
    peak (the footprint since session 26) over an older one."""
    verdicts: dict[tuple[str, str], tuple[bool, str]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        entry = json.loads(line)
        figures, key = entry["figures"], (entry["experiment"], entry["cell"])
        peak = figures.get("footprint") == "xla-tpu peak"
        if key in verdicts and verdicts[key][0] and not peak:
            continue
        verdicts[key] = (peak, _verdict(figures))
    return {key: text for key, (_, text) in verdicts.items()}


def _verdict(figures: dict) -> str:
    if "refused" in figures:
        return "not compiled (" + figures["refused"].split(";")[0] + ")"
    trainer = figures["xla"][0]
    if figures["xla_refusal"] is not None:
        return f"does not fit: XLA-TPU refused the trainer at {trainer:.1f} GiB"
    return f"{'fits' if figures['fits'] else 'does not fit'}: trainer {trainer:.1f} GiB (XLA-TPU)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeFigures:
    """XLA-TPU's figures of one decode iteration (one replica, `rows` rows), at full depth."""

    model: str
    device_kind: str
    tp: int
    rows: int
    dtype: str
    weight_bytes: float  # per device: Q_w / t
    kv_bytes_per_token: float  # per device, one row's cached token
    xla_bytes_accessed: float
    xla_flops: float
    collectives: int
    # XLA's FLOPs per cached token of one row (attention over the cache); 0 where not compiled
    xla_flops_per_cached_token: float = 0.0


def read_decode_figures(path: Path = DECODE_CACHE) -> list[DecodeFigures]:
    if not path.exists():
        return []
    names = {f.name for f in dataclasses.fields(DecodeFigures)}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [DecodeFigures(**{k: v for k, v in line.items() if k in names}) for line in lines]


def decode_figures(cache: list[DecodeFigures], *, model: str, tp: int, dtype: str) -> DecodeFigures:
    """The cached figures of `model` at rollout TP `tp` in `dtype`, or a refusal naming the
    command that compiles them."""
    for figures in cache:
        if (figures.model, figures.tp, figures.dtype) == (model, tp, dtype):
            return figures
    raise ConfigError(
        f"no compiled decode iteration of model={model} at rollout.tensor_parallel={tp} in "
        f"{dtype} in {DECODE_CACHE.name}; compile it with `python {TOOL} --models {model} "
        f"--tp {tp} --dtype {dtype}` (XLA-TPU, no TPU needed)."
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class IterationPrediction:
    """Eq. 2's terms of one decode iteration per TensorCore, ms."""

    kappa_ms: float
    weight_ms: float  # Q_w / (t beta_eff)
    kv_ms: float  # Q_KV / beta_eff
    tp_ms: float  # C_TP(t)
    compute_ms: float  # XLA's FLOPs at the core's peak: omitted by Eq. 2, shown beside it
    # XLA's bytes accessed / beta_eff of the iteration as compiled (its `rows`, a 32-slot cache):
    # a compiler figure beside Eq. 2, not its bytes term
    xla_bytes_ms: float

    @property
    def total_ms(self) -> float:
        """Eq. 2: d_iter(t) = kappa + (Q_w / t + Q_KV) / beta_eff + C_TP(t)."""
        return self.kappa_ms + self.weight_ms + self.kv_ms + self.tp_ms


def predict_iteration(
    figures: DecodeFigures,
    *,
    rows: int,
    cached_tokens: float,
    hop_ms: float = ALPHA_COLLECTIVE_MS.value,
) -> IterationPrediction:
    """Eq. 2 for `rows` rows per replica holding `cached_tokens` tokens each on average. C_TP(t)
    is the compiled program's collectives x `hop_ms` x (t - 1), the steps of a collective over
    t devices: App. C's per-collective cost fitted at TP2 (one step), grown with t."""
    beta = BETA_EFF.value
    per_row_flops = figures.xla_flops / figures.rows
    peak = CHIPS["tpu_v7x"].per_core(CHIPS["tpu_v7x"].peak_bf16_flops)
    return IterationPrediction(
        kappa_ms=KAPPA_MS.value,
        weight_ms=1e3 * figures.weight_bytes / beta,
        kv_ms=1e3 * rows * cached_tokens * figures.kv_bytes_per_token / beta,
        tp_ms=figures.collectives * hop_ms * (figures.tp - 1),
        compute_ms=1e3 * per_row_flops * rows / peak,
        xla_bytes_ms=1e3 * figures.xla_bytes_accessed / beta,
    )


def read_length_mix(path: Path = LENGTH_CACHE) -> dict[str, dict]:
    """Mean prompt and completion tokens of each dataset's stored rows (Qwen3 tokens)."""
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {line["dataset"]: line for line in lines}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellShape:
    """What Eq. 2 needs of a cell: its engine replicas' rows and waves, and its lengths."""

    cell: str
    model: str
    chip: str
    tp: int
    dtype: str
    rows: int  # rows per replica in a wave
    waves: int
    lockstep: bool  # one engine over several hosts (the single controller)
    prompt_tokens: float  # mean prompt tokens a row holds when decode starts
    lengths_from: str


def replica_rows(requests: int, replicas: int, max_rows: int) -> tuple[int, int]:
    """(rows per replica in a wave, waves): `requests` spread over `replicas`, in waves of at
    most `max_rows` rows (0: one wave)."""
    per_replica = math.ceil(requests / replicas)
    waves = math.ceil(per_replica / max_rows) if max_rows else 1
    return math.ceil(per_replica / waves), waves


def engine_replicas(config) -> tuple[int, int]:
    """(the step's engine replicas, the most rows a replica holds at a time; 0: no cap): vLLM's
    `data_parallel` ranks per host, each up to `max_sequences_per_replica`; the JAX engine's
    devices / TP per host, sharing an engine's `capacity` (0 here when the plan sizes it)."""
    r, layout = config.rollout, config.layout
    if r.engine.value == "vllm":
        return layout.rollout_hosts * r.data_parallel // layout.hosts_per_engine, (
            r.max_sequences_per_replica
        )
    per_engine = layout.hosts_per_engine * layout.devices_per_host // r.tensor_parallel
    engines = layout.rollout_hosts // layout.hosts_per_engine
    return engines * per_engine, -(-r.capacity // per_engine) if r.capacity else 0


def cell_shape(cell: str, config, lengths: dict[str, dict]) -> CellShape:
    """The cell's shape from its typed config (`locoexp.config.Config`)."""
    d, r, layout = config.dataset, config.rollout, config.layout
    replicas, most = engine_replicas(config)
    rows, waves = replica_rows(d.prompts_per_step * d.samples_per_prompt, replicas, most)
    mix = lengths.get(d.kind.value)
    prompt, source = (
        (min(mix["mean_prompt_tokens"], d.max_prompt_tokens), f"{d.kind.value}'s stored rows")
        if mix
        else (float(d.max_prompt_tokens), "the prompt cap (no stored length mix)")
    )
    dtype = (r.param_dtype or config.model.param_dtype).value
    return CellShape(
        cell=cell, model=config.model.name, chip=config.hardware.chip.value,
        tp=r.tensor_parallel, dtype=dtype, rows=rows, waves=waves,
        lockstep=layout.hosts_per_engine > 1, prompt_tokens=prompt,
        lengths_from=source,
    )  # fmt: skip


def predict_cell(shape: CellShape, cache: list[DecodeFigures]) -> dict:
    """One row of `predict`'s table: the cell's decode iteration as decode starts."""
    if shape.chip != "tpu_v7x":
        raise ConfigError(
            f"{shape.cell}: hardware.chip={shape.chip}; beta_eff and kappa were measured on "
            "tpu_v7x only, so predict covers tpu_v7x cells."
        )
    if shape.lockstep:
        raise ConfigError(
            f"{shape.cell}: one lockstep engine over several hosts; its per-iteration join "
            "(Eq. 1, App. C trade-off 3: 2.15 against 0.90 ms) is not modelled."
        )
    figures = decode_figures(cache, model=shape.model, tp=shape.tp, dtype=shape.dtype)
    p = predict_iteration(figures, rows=shape.rows, cached_tokens=shape.prompt_tokens)
    return {
        "cell": shape.cell,
        "tp": shape.tp,
        "rows": shape.rows,
        "compiled_rows": figures.rows,
        "waves": shape.waves,
        "prompt_tokens": round(shape.prompt_tokens, 1),
        "lengths": shape.lengths_from,
        **{k: round(v, 3) for k, v in dataclasses.asdict(p).items()},
        "d_iter_ms": round(p.total_ms, 3),
    }
