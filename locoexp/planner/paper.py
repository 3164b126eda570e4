"""The cells the paper ran, as `run.py` override lists (data; the dry-run test and
tools/plan_paper_cells.py plan every one of them).

- Stack comparison (Table 1, Table 3): GSM8K (bf16 trainer, Section 3.1), NuminaMath-CoT and
  SWE-agent on Qwen3-0.6B at 8-64 chips, colocated and single-controller.
- CO vs DA (Section 4.4, Table F1): the three workloads under `da` at 8-256 chips; the paper
  ran the splits 0.5, 0.25 and 0.125, the test plans every valid split.
- Scale study (Section 4.1, Table H1): OpenMathInstruct-2, 256 x 8 forced to 8,192 tokens, bf16,
  one lockstep sampler over 128 chips, at TP8 (0.6B-70B), TP16 (all but 14B) and TP32 (~200B,
  405B). `WORKAROUNDS` holds the settings a cell needs to fit (Table H2: the paper
  itself needed q/k/v remat and freed sampler copies at 405B).
"""

import dataclasses
from collections.abc import Callable, Iterator

from locoexp.errors import ConfigError

STACK_WORKLOADS = {
    "gsm8k": ["dataset=gsm8k", "model.param_dtype=bfloat16"],
    "numinamath_cot": ["dataset=numinamath_cot"],
    "swe_agent": ["dataset=swe_agent"],
}
STACK_CHIPS = (8, 16, 32, 64)
DA_CHIPS = (8, 16, 32, 64, 128, 256)
PAPER_SPLITS = (0.5, 0.25, 0.125)
SCALE_STUDY = [
    "hardware=tpu_v7x_128",
    "placement=single_controller",
    "dataset=openmathinstruct2",
    "rollout.ignore_eos=true",
    "model.param_dtype=bfloat16",
]
SCALE_MODELS = {  # model: the TPs the paper ran it at (Table H1; ~100B at TP16 only)
    "qwen3_0_6b": (8, 16),
    "qwen3_1_7b": (8, 16),
    "qwen3_4b": (8, 16),
    "qwen3_8b": (8, 16),
    "qwen3_14b": (8,),
    "qwen3_32b": (8, 16),
    "llama3_1_70b": (8, 16),
    "synthetic_100b": (16,),
    "synthetic_200b": (16, 32),
    "llama3_1_405b": (16, 32),
}
# Cell label -> the overrides it needs to fit (the paper's own workarounds, or beyond them).
# From 14B up the trainer rematerialises each block (MaxText's default full remat, which the
# paper's Pathways trainer ran). 405B offloads its saved matmul outputs to host memory (Table
# H2: at TP32 the paper needed q/k/v remat only; locoexp's remat=block plans 119 GiB there,
# offload 86.5 GiB of 94.7), and at TP16 also frees the engine's weight copy during the train
# step (Table H2: at TP16 the paper needed q/k/v remat, a compiler flag and freeing the
# sampler's weights and KV cache).
# SWE-agent under da with a one-host trainer (8 devices) rematerialises too: the paper ran no
# such cell (Appendix F: SWE at 8-16 chips did not fit its trainer).
WORKAROUNDS: dict[str, list[str]] = {
    **{
        f"{model} TP{tp}": ["trainer.remat=block"]
        for model in ("qwen3_14b", "qwen3_32b", "llama3_1_70b", "synthetic_100b", "synthetic_200b")
        for tp in SCALE_MODELS[model]
    },
    "llama3_1_405b TP16": ["trainer.remat=offload", "rollout.release_weights_during_training=true"],
    "llama3_1_405b TP32": ["trainer.remat=offload"],
}


# What the paper itself did where a cell did not fit at first (model, rollout TP, chips): the
# sentence a refusal of that cell adds, with locoexp's nearest settings.
PAPER_WORKAROUNDS = {
    ("llama3_1_405b", 16, 128): (
        "Table H1 fit 405B at TP16 with a compiler flag, freeing the sampler's weight copy and "
        "KV cache, and q/k/v remat, 16 sequences per replica (here: trainer.remat=offload "
        "rollout=jax rollout.release_weights_during_training=true rollout.capacity=256 "
        "rollout.prefill_chunk_tokens=256)"
    ),
    ("llama3_1_405b", 32, 128): (
        "Table H1 fit 405B at TP32 with q/k/v remat, 32 sequences per replica (here: "
        "trainer.remat=offload rollout.capacity=256)"
    ),
}


def paper_workaround(model: str, tensor_parallel: int, chips: int) -> str:
    """The paper's own workaround for a cell that needed one ("" where it named none)."""
    return PAPER_WORKAROUNDS.get((model, tensor_parallel, chips), "")


def stack_cells() -> list[tuple[str, list[str]]]:
    return [
        (
            f"{name} {placement} {chips} chips",
            ["model=qwen3_0_6b", *overrides, f"hardware=tpu_v7x_{chips}", f"placement={placement}"],
        )
        for name, overrides in STACK_WORKLOADS.items()
        for chips in STACK_CHIPS
        for placement in ("co", "single_controller")
    ]


def da_cells(*, every_split: bool) -> list[tuple[str, list[str]]]:
    cells = []
    for name, overrides in STACK_WORKLOADS.items():
        for chips in DA_CHIPS:
            hosts = chips // 4
            splits = [t / hosts for t in range(1, hosts)] if every_split else PAPER_SPLITS
            for split in splits:
                if round(split * hosts) < 1 or round(split * hosts) >= hosts:
                    continue
                one_host = name == "swe_agent" and round(split * hosts) == 1
                remat = ["trainer.remat=block"] if one_host else []
                cells.append(
                    (
                        f"{name} da {chips} chips split={split:.3f}".rstrip("0"),
                        [
                            "model=qwen3_0_6b",
                            *overrides,
                            f"hardware=tpu_v7x_{chips}",
                            "placement=da",
                            f"split={split:.3f}".rstrip("0"),
                            *remat,
                        ],
                    )
                )
    return cells


def scale_cells() -> list[tuple[str, list[str]]]:
    return [
        (f"{model} TP{tp}", [*SCALE_STUDY, f"model={model}", f"rollout.tensor_parallel={tp}"])
        for model, tps in SCALE_MODELS.items()
        for tp in tps
    ]


def paper_cells(*, every_split: bool = True) -> list[tuple[str, list[str]]]:
    """Every cell with its overrides (and its workaround overrides, where it needs any)."""
    cells = stack_cells() + da_cells(every_split=every_split) + scale_cells()
    return [(label, overrides + WORKAROUNDS.get(label, [])) for label, overrides in cells]


def cell_setups(cells, *, compose_configs: Callable, setup_of: Callable) -> Iterator[tuple]:
    """(label, plan setup, or the root Config's `ConfigError`) of every cell, each base composed
    once (`compose_configs(override lists)`, `setup_of(config)`: the caller's composition and
    plan setup, so this module reads no config). The Config refuses the da splits whose trainer
    hosts do not divide the sequences (each trainer host packs an equal share)."""
    grouped = grouped_by_split(cells)
    bases = list(grouped)
    jobs = [[*b, "split=0.5"] if "placement=da" in b else list(b) for b in bases]
    for base, config in zip(bases, compose_configs(jobs), strict=True):
        for label, split in grouped[base]:
            if split is None:
                yield label, setup_of(config)
                continue
            try:
                yield label, setup_of(dataclasses.replace(config, split=split))
            except ConfigError as error:
                yield label, error


def grouped_by_split(
    cells: list[tuple[str, list[str]]],
) -> dict[tuple[str, ...], list[tuple[str, float | None]]]:
    """Cells keyed by their overrides without `split=`, so a caller composes each base once
    (with split=0.5, valid on every even host count) and replaces the split."""
    grouped: dict[tuple[str, ...], list[tuple[str, float | None]]] = {}
    for label, overrides in cells:
        base = tuple(o for o in overrides if not o.startswith("split="))
        split = next(
            (
                float(o.removeprefix("split="))
                for o in overrides
                if o != base and o.startswith("split=")
            ),
            None,
        )
        grouped.setdefault(base, []).append((label, split))
    return grouped
