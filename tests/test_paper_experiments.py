"""Every cell of every paper experiment file plans as the paper says of its cell.

Each cell of `python run.py -m +experiment=<name>` (the file's own sweep, expanded as the dry
run expands it; the experiment files are the one source of the cells) is planned on its slice
(its first launch or seed: the launches and seeds of a cell plan alike, checked on one cell of
each file) and its verdict set beside the paper's, a table below that cites where the paper says
it: ran, did not fit, not run (or unstated: Table B1 names no cells). The plan agrees with "ran"
when it fits as locoexp runs it and the paper's trainer layout (no gradient accumulation,
`trainer.accumulate=false`) fits too; with "did not fit" when the cell fits only by accumulating
gradients or does not fit at all. "not run" and "unstated" cells make no claim on memory. Where
the plan disagrees the cell is listed in `NEEDS_ACCUMULATION`, with the reason by group. The
test fails when a cell moves either way.
"""

import pytest

from locoexp.compose import compose_config, compose_configs, sweep_jobs
from locoexp.errors import ConfigError
from locoexp.planner import check_fit
from locoexp.planner.paper import PAPER_EXPERIMENTS, cell_of, verdict_category
from locoexp.planner.report import verdict_of
from locoexp.session.build import plan_setup

PAPER = [  # experiment, cell, the paper's verdict, where it says so
    ("stack_comparison", "gsm8k tpu_v7x_8 single_controller", "ran", "Table 3"),
    ("stack_comparison", "gsm8k tpu_v7x_8 co_base", "ran", "Table 3"),
    ("stack_comparison", "gsm8k tpu_v7x_8 co_optimized", "ran", "Table 3"),
    ("stack_comparison", "gsm8k tpu_v7x_16 single_controller", "ran", "Table 3"),
    ("stack_comparison", "gsm8k tpu_v7x_16 co_base", "ran", "Table 3"),
    ("stack_comparison", "gsm8k tpu_v7x_16 co_optimized", "ran", "Table 3"),
    ("stack_comparison", "gsm8k tpu_v7x_32 single_controller", "ran", "Table 3"),
    ("stack_comparison", "gsm8k tpu_v7x_32 co_base", "ran", "Table 3"),
    ("stack_comparison", "gsm8k tpu_v7x_32 co_optimized", "ran", "Table 3"),
    ("stack_comparison", "gsm8k tpu_v7x_64 single_controller", "ran", "Table 3"),
    ("stack_comparison", "gsm8k tpu_v7x_64 co_base", "ran", "Table 3"),
    ("stack_comparison", "gsm8k tpu_v7x_64 co_optimized", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_8 single_controller", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_8 co_base", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_8 co_optimized", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_16 single_controller", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_16 co_base", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_16 co_optimized", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_32 single_controller", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_32 co_base", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_32 co_optimized", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_64 single_controller", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_64 co_base", "ran", "Table 3"),
    ("stack_comparison", "numinamath_cot tpu_v7x_64 co_optimized", "ran", "Table 3"),
    ("stack_comparison", "swe_agent tpu_v7x_8 single_controller", "ran", "Table 3"),
    (
        "stack_comparison",
        "swe_agent tpu_v7x_8 co_base",
        "did not fit",
        "Table 3: needs 157.6 of 94.7 GiB per device",
    ),
    (
        "stack_comparison",
        "swe_agent tpu_v7x_8 co_optimized",
        "did not fit",
        "Table 3: needs 157.6 of 94.7 GiB per device",
    ),
    ("stack_comparison", "swe_agent tpu_v7x_16 single_controller", "ran", "Table 3"),
    ("stack_comparison", "swe_agent tpu_v7x_16 co_base", "ran", "Table 3"),
    ("stack_comparison", "swe_agent tpu_v7x_16 co_optimized", "ran", "Table 3"),
    ("stack_comparison", "swe_agent tpu_v7x_32 single_controller", "ran", "Table 3"),
    ("stack_comparison", "swe_agent tpu_v7x_32 co_base", "ran", "Table 3"),
    ("stack_comparison", "swe_agent tpu_v7x_32 co_optimized", "ran", "Table 3"),
    ("stack_comparison", "swe_agent tpu_v7x_64 single_controller", "ran", "Table 3"),
    ("stack_comparison", "swe_agent tpu_v7x_64 co_base", "ran", "Table 3"),
    ("stack_comparison", "swe_agent tpu_v7x_64 co_optimized", "ran", "Table 3"),
    ("co_vs_da", "gsm8k c128_co", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c128_da_12_5", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c128_da_25", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c128_da_50", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c16_co", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c16_da_25", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c16_da_50", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c256_co", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c256_da_12_5", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c256_da_25", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c256_da_50", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c32_co", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c32_da_12_5", "not run", "Table F1: -"),
    ("co_vs_da", "gsm8k c32_da_25", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c32_da_50", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c64_co", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c64_da_12_5", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c64_da_25", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c64_da_50", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c8_co", "ran", "Table F1"),
    ("co_vs_da", "gsm8k c8_da_50", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c128_co", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c128_da_12_5", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c128_da_25", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c128_da_50", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c16_co", "ran", "Table F1 (its 16-chip CO point is Figure 4's)"),
    (
        "co_vs_da",
        "numinamath_cot c16_da_25",
        "not run",
        "App. F: no Ray point for NuminaMath or SWE at 8-16 chips",
    ),
    (
        "co_vs_da",
        "numinamath_cot c16_da_50",
        "not run",
        "App. F: no Ray point for NuminaMath or SWE at 8-16 chips",
    ),
    ("co_vs_da", "numinamath_cot c256_co", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c256_da_12_5", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c256_da_25", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c256_da_50", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c32_co", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c32_da_12_5", "not run", "Table F1: -"),
    ("co_vs_da", "numinamath_cot c32_da_25", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c32_da_50", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c64_co", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c64_da_12_5", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c64_da_25", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c64_da_50", "ran", "Table F1"),
    ("co_vs_da", "numinamath_cot c8_co", "ran", "Table 3 (LoCoJAX optimized)"),
    (
        "co_vs_da",
        "numinamath_cot c8_da_50",
        "not run",
        "App. F: no Ray point for NuminaMath or SWE at 8-16 chips",
    ),
    ("co_vs_da", "swe_agent c128_co", "ran", "Table F1"),
    ("co_vs_da", "swe_agent c128_da_12_5", "ran", "Table F1"),
    ("co_vs_da", "swe_agent c128_da_25", "ran", "Table F1"),
    ("co_vs_da", "swe_agent c128_da_50", "ran", "Table F1"),
    ("co_vs_da", "swe_agent c16_co", "ran", "Table 3"),
    (
        "co_vs_da",
        "swe_agent c16_da_25",
        "not run",
        "App. F: no Ray point for NuminaMath or SWE at 8-16 chips",
    ),
    (
        "co_vs_da",
        "swe_agent c16_da_50",
        "not run",
        "App. F: no Ray point for NuminaMath or SWE at 8-16 chips",
    ),
    ("co_vs_da", "swe_agent c256_co", "ran", "Table F1"),
    ("co_vs_da", "swe_agent c256_da_12_5", "ran", "Table F1"),
    ("co_vs_da", "swe_agent c256_da_25", "ran", "Table F1"),
    ("co_vs_da", "swe_agent c256_da_50", "ran", "Table F1"),
    ("co_vs_da", "swe_agent c32_co", "ran", "Table F1"),
    ("co_vs_da", "swe_agent c32_da_12_5", "not run", "Table F1: -"),
    (
        "co_vs_da",
        "swe_agent c32_da_25",
        "did not fit",
        "App. F: a 2-host SWE trainer needs 157.6 of 94.7 GiB",
    ),
    (
        "co_vs_da",
        "swe_agent c32_da_50",
        "ran",
        "Table F1; App. F: the 4/4 split fits, 91.2 of 94.7 GiB",
    ),
    ("co_vs_da", "swe_agent c64_co", "ran", "Table F1"),
    (
        "co_vs_da",
        "swe_agent c64_da_12_5",
        "not run",
        "Table F1: - (a 2-host SWE trainer does not fit, App. F)",
    ),
    ("co_vs_da", "swe_agent c64_da_25", "ran", "Table F1"),
    ("co_vs_da", "swe_agent c64_da_50", "ran", "Table F1"),
    ("co_vs_da", "swe_agent c8_co", "did not fit", "Table 3: needs 157.6 of 94.7 GiB per device"),
    (
        "co_vs_da",
        "swe_agent c8_da_50",
        "not run",
        "App. F: no Ray point for NuminaMath or SWE at 8-16 chips",
    ),
    ("scale_study", "llama3_1_405b_tp16", "ran", "Table H1"),
    ("scale_study", "llama3_1_405b_tp32", "ran", "Table H1"),
    ("scale_study", "llama3_1_70b_tp16", "ran", "Table H1"),
    ("scale_study", "llama3_1_70b_tp4", "ran", "Table H1"),
    ("scale_study", "llama3_1_70b_tp8", "ran", "Table H1"),
    ("scale_study", "qwen3_0_6b_tp1", "ran", "Table H1"),
    ("scale_study", "qwen3_0_6b_tp16", "ran", "Table H1"),
    ("scale_study", "qwen3_0_6b_tp2", "ran", "Table H1"),
    ("scale_study", "qwen3_0_6b_tp4", "ran", "Table H1"),
    ("scale_study", "qwen3_0_6b_tp8", "ran", "Table H1"),
    ("scale_study", "qwen3_14b_tp2", "ran", "Table H1"),
    ("scale_study", "qwen3_14b_tp4", "ran", "Table H1"),
    ("scale_study", "qwen3_14b_tp8", "ran", "Table H1"),
    ("scale_study", "qwen3_1_7b_tp1", "ran", "Table H1"),
    ("scale_study", "qwen3_1_7b_tp16", "ran", "Table H1"),
    ("scale_study", "qwen3_1_7b_tp2", "ran", "Table H1"),
    ("scale_study", "qwen3_1_7b_tp4", "ran", "Table H1"),
    ("scale_study", "qwen3_1_7b_tp8", "ran", "Table H1"),
    ("scale_study", "qwen3_32b_tp16", "ran", "Table H1"),
    ("scale_study", "qwen3_32b_tp2", "ran", "Table H1"),
    ("scale_study", "qwen3_32b_tp4", "ran", "Table H1"),
    ("scale_study", "qwen3_32b_tp8", "ran", "Table H1"),
    ("scale_study", "qwen3_4b_tp1", "ran", "Table H1"),
    ("scale_study", "qwen3_4b_tp16", "ran", "Table H1"),
    ("scale_study", "qwen3_4b_tp2", "ran", "Table H1"),
    ("scale_study", "qwen3_4b_tp4", "ran", "Table H1"),
    ("scale_study", "qwen3_4b_tp8", "ran", "Table H1"),
    ("scale_study", "qwen3_8b_tp1", "ran", "Table H1"),
    ("scale_study", "qwen3_8b_tp16", "ran", "Table H1"),
    ("scale_study", "qwen3_8b_tp2", "ran", "Table H1"),
    ("scale_study", "qwen3_8b_tp4", "ran", "Table H1"),
    ("scale_study", "qwen3_8b_tp8", "ran", "Table H1"),
    ("scale_study", "synthetic_100b_tp16", "ran", "Table H1"),
    ("scale_study", "synthetic_200b_tp16", "ran", "Table H1"),
    ("scale_study", "synthetic_200b_tp32", "ran", "Table H1"),
    ("cost_to_learn", "tpu_v7x_4 single_controller", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_4 co_base", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_4 co_optimized", "ran", "Table I5 (own best)"),
    ("cost_to_learn", "tpu_v7x_8 single_controller", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_8 co_base", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_8 co_optimized", "ran", "Table I5 (own best)"),
    ("cost_to_learn", "tpu_v7x_16 single_controller", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_16 co_base", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_16 co_optimized", "ran", "Table I5 (own best)"),
    ("cost_to_learn", "tpu_v7x_32 single_controller", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_32 co_base", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_32 co_optimized", "ran", "Table I5 (own best)"),
    ("cost_to_learn", "tpu_v7x_64 single_controller", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_64 co_base", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_64 co_optimized", "ran", "Table I5 (own best)"),
    ("cost_to_learn", "tpu_v7x_128 single_controller", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_128 co_base", "ran", "Table I1"),
    ("cost_to_learn", "tpu_v7x_128 co_optimized", "ran", "Table I5 (own best)"),
    ("scale_controls", "legacy_llama3_1_70b_tp8_64", "ran", "Table H2 (d)"),
    ("scale_controls", "legacy_qwen3_0_6b_tp8_64", "ran", "Table H2 (d)"),
    ("scale_controls", "legacy_qwen3_14b_tp8_64", "ran", "Table H2 (d)"),
    ("scale_controls", "legacy_qwen3_1_7b_tp8_64", "ran", "Table H2 (d)"),
    ("scale_controls", "legacy_qwen3_32b_tp8_64", "ran", "Table H2 (d)"),
    ("scale_controls", "legacy_qwen3_4b_tp8_64", "ran", "Table H2 (d)"),
    ("scale_controls", "legacy_qwen3_8b_tp8_64", "ran", "Table H2 (d)"),
    ("scale_controls", "llama3_1_8b_tp16", "ran", "Table H2 (b)"),
    ("scale_controls", "package_200b_tp16", "ran", "Table H2 (a)"),
    ("scale_controls", "qkv_remat_200b_tp32", "ran", "Table H2 (a)"),
    ("scale_controls", "qwen3_14b_tp1", "ran", "Table H2 (c)"),
    ("scale_controls", "wave_control_200b_tp16", "ran", "Table H2 (a)"),
    ("tp_sweep_64", "qwen3_0_6b_tp1", "ran", "App. C item 1 (Section 4.1's 64-chip sweep)"),
    ("tp_sweep_64", "qwen3_0_6b_tp2", "ran", "App. C item 1 (Section 4.1's 64-chip sweep)"),
    ("tp_sweep_64", "qwen3_4b_tp1", "ran", "App. C item 1 (Section 4.1's 64-chip sweep)"),
    ("tp_sweep_64", "qwen3_4b_tp2", "ran", "App. C item 1 (Section 4.1's 64-chip sweep)"),
    ("model_size", "gsm8k_14b single_controller", "ran", "Table E2"),
    ("model_size", "gsm8k_14b co_optimized", "ran", "Table E2"),
    ("model_size", "gsm8k_1_7b single_controller", "ran", "Table E2"),
    ("model_size", "gsm8k_1_7b co_optimized", "ran", "Table E2"),
    ("model_size", "gsm8k_32b single_controller", "ran", "Table E2"),
    ("model_size", "gsm8k_32b co_optimized", "ran", "Table E2"),
    ("model_size", "gsm8k_4b single_controller", "ran", "Table E2"),
    ("model_size", "gsm8k_4b co_optimized", "ran", "Table E2"),
    ("model_size", "gsm8k_8b single_controller", "ran", "Table E2"),
    ("model_size", "gsm8k_8b co_optimized", "ran", "Table E2"),
    ("model_size", "numinamath_14b single_controller", "ran", "Table E1"),
    ("model_size", "numinamath_14b co_optimized", "ran", "Table E1"),
    ("model_size", "numinamath_1_7b single_controller", "ran", "Table E1"),
    ("model_size", "numinamath_1_7b co_optimized", "ran", "Table E1"),
    ("model_size", "numinamath_32b single_controller", "ran", "Table E1"),
    ("model_size", "numinamath_32b co_optimized", "ran", "Table E1"),
    ("model_size", "numinamath_4b single_controller", "ran", "Table E1"),
    ("model_size", "numinamath_4b co_optimized", "ran", "Table E1"),
    ("model_size", "numinamath_8b single_controller", "ran", "Table E1"),
    ("model_size", "numinamath_8b co_optimized", "ran", "Table E1"),
    ("model_size", "swe_14b single_controller", "not run", "Table E1: no Pathways time at SWE 14B"),
    (
        "model_size",
        "swe_14b co_optimized",
        "did not fit",
        "Table E1: LoCoJAX does not fit (4 settings)",
    ),
    ("model_size", "swe_1_7b single_controller", "ran", "Table E1"),
    ("model_size", "swe_1_7b co_optimized", "ran", "Table E1"),
    ("model_size", "swe_4b single_controller", "ran", "Table E1"),
    ("model_size", "swe_4b co_optimized", "ran", "Table E1"),
    ("model_size", "swe_8b single_controller", "ran", "Table E1"),
    ("model_size", "swe_8b co_optimized", "ran", "Table E1"),
    ("pathways_ratio", "tpu_v7x_4 single_controller", "ran", "Table E3"),
    ("pathways_ratio", "tpu_v7x_4 co_base", "ran", "Table E3"),
    ("pathways_ratio", "tpu_v7x_8 single_controller", "ran", "Table E3"),
    ("pathways_ratio", "tpu_v7x_8 co_base", "ran", "Table E3"),
    ("pathways_ratio", "tpu_v7x_16 single_controller", "ran", "Table E3"),
    ("pathways_ratio", "tpu_v7x_16 co_base", "ran", "Table E3"),
    ("pathways_ratio", "tpu_v7x_32 single_controller", "ran", "Table E3"),
    ("pathways_ratio", "tpu_v7x_32 co_base", "ran", "Table E3"),
    ("pathways_ratio", "tpu_v7x_64 single_controller", "ran", "Table E3"),
    ("pathways_ratio", "tpu_v7x_64 co_base", "ran", "Table E3"),
    ("pathways_ratio", "tpu_v7x_128 single_controller", "ran", "Table E3"),
    ("pathways_ratio", "tpu_v7x_128 co_base", "ran", "Table E3"),
    ("cost_to_learn_seeds", "tpu_v7x_16 single_controller", "ran", "App. I.2 (n=5)"),
    ("cost_to_learn_seeds", "tpu_v7x_16 co_base", "ran", "App. I.2 (n=5)"),
    ("cost_to_learn_seeds", "tpu_v7x_64 single_controller", "ran", "App. I.2 (n=5)"),
    ("cost_to_learn_seeds", "tpu_v7x_64 co_base", "ran", "App. I.2 (n=5)"),
    ("cost_to_learn_frozen", "tpu_v7x_4", "ran", "Table I5 (Frozen / Pathways)"),
    ("cost_to_learn_frozen", "tpu_v7x_8", "ran", "Table I5 (Frozen / Pathways)"),
    ("cost_to_learn_frozen", "tpu_v7x_16", "ran", "Table I5 (Frozen / Pathways)"),
    ("cost_to_learn_frozen", "tpu_v7x_32", "ran", "Table I5 (Frozen / Pathways)"),
    ("cost_to_learn_frozen", "tpu_v7x_64", "ran", "Table I5 (Frozen / Pathways)"),
    ("cost_to_learn_frozen", "tpu_v7x_128", "ran", "Table I5 (Frozen / Pathways)"),
    ("lever_ablation", "tpu_v7x_8 all_on", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_8 o1_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_8 o2_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_8 o3_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_8 o4_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_16 all_on", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_16 o1_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_16 o2_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_16 o3_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_16 o4_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_32 all_on", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_32 o1_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_32 o2_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_32 o3_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_32 o4_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_64 all_on", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_64 o1_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_64 o2_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_64 o3_off", "unstated", "Table B1 names no cells"),
    ("lever_ablation", "tpu_v7x_64 o4_off", "unstated", "Table B1 names no cells"),
    ("maxtext_gemma4_recipe", "co_optimized", "ran", "Table G1: CO 139.1 s/step (2.14x)"),
    ("maxtext_gemma4_recipe", "da_50", "ran", "Table G1: DA 32 + 32, 269.2 s/step (1.10x)"),
]

# (experiment, cell): the paper ran it; the plan says it fits only by accumulating gradients.
# The paper's layout is sized at the caps where the paper gives no real lengths (GSM8K and
# NuminaMath: no output lengths), and at SWE's real mean sequence (`dataset.mean_sequence_tokens`)
# in float32 activations, where the paper's MaxText/Tunix trainer computes in bfloat16 (SWE at 16
# chips: 118.1 GiB here; tests/test_paper_layout_memory.py). The 4-chip single controller
# (pathways_ratio, cost_to_learn): at one host the plan's roles cannot tell it from co.
NEEDS_ACCUMULATION = [
    ("stack_comparison", "numinamath_cot tpu_v7x_8 co_base"),
    ("stack_comparison", "numinamath_cot tpu_v7x_8 co_optimized"),
    ("stack_comparison", "numinamath_cot tpu_v7x_16 co_base"),
    ("stack_comparison", "numinamath_cot tpu_v7x_16 co_optimized"),
    ("stack_comparison", "numinamath_cot tpu_v7x_32 co_base"),
    ("stack_comparison", "numinamath_cot tpu_v7x_32 co_optimized"),
    ("stack_comparison", "swe_agent tpu_v7x_16 co_base"),
    ("stack_comparison", "swe_agent tpu_v7x_16 co_optimized"),
    ("co_vs_da", "gsm8k c16_da_25"),
    ("co_vs_da", "gsm8k c8_da_50"),
    ("co_vs_da", "numinamath_cot c128_da_12_5"),
    ("co_vs_da", "numinamath_cot c128_da_25"),
    ("co_vs_da", "numinamath_cot c16_co"),
    ("co_vs_da", "numinamath_cot c256_da_12_5"),
    ("co_vs_da", "numinamath_cot c32_co"),
    ("co_vs_da", "numinamath_cot c32_da_25"),
    ("co_vs_da", "numinamath_cot c32_da_50"),
    ("co_vs_da", "numinamath_cot c64_da_12_5"),
    ("co_vs_da", "numinamath_cot c64_da_25"),
    ("co_vs_da", "numinamath_cot c64_da_50"),
    ("co_vs_da", "numinamath_cot c8_co"),
    ("co_vs_da", "swe_agent c128_da_12_5"),
    ("co_vs_da", "swe_agent c16_co"),
    ("co_vs_da", "swe_agent c32_da_50"),
    ("co_vs_da", "swe_agent c64_da_25"),
    ("model_size", "numinamath_14b co_optimized"),
    ("model_size", "numinamath_32b co_optimized"),
    ("model_size", "numinamath_8b co_optimized"),
    ("model_size", "swe_8b co_optimized"),
    ("pathways_ratio", "tpu_v7x_4 single_controller"),
    ("pathways_ratio", "tpu_v7x_4 co_base"),
    ("cost_to_learn", "tpu_v7x_4 single_controller"),
    ("cost_to_learn", "tpu_v7x_4 co_base"),
    ("cost_to_learn", "tpu_v7x_4 co_optimized"),
    ("cost_to_learn", "tpu_v7x_8 co_base"),
    ("cost_to_learn", "tpu_v7x_8 co_optimized"),
    ("cost_to_learn", "tpu_v7x_16 co_base"),
    ("cost_to_learn", "tpu_v7x_16 co_optimized"),
    ("cost_to_learn_seeds", "tpu_v7x_16 co_base"),
    ("cost_to_learn_frozen", "tpu_v7x_4"),
]


def plan_category(config) -> str:
    return verdict_category(verdict_of(plan_setup(config)))


def agrees(paper: str, plan: str) -> bool:
    match paper:
        case "ran":
            return plan == "fits"
        case "did not fit":
            return plan != "fits"
        case _:  # not run, unstated: no claim on memory
            return True


def jobs_by_cell(experiment: str) -> dict[str, list[list[str]]]:
    """The jobs of `python run.py -m +experiment=<name>`, by cell (its launches and seeds)."""
    cells: dict[str, list[list[str]]] = {}
    for job in sweep_jobs(["-m", f"+experiment={experiment}"]):
        cells.setdefault(cell_of(job), []).append(job)
    return cells


@pytest.mark.parametrize("experiment", PAPER_EXPERIMENTS)
def test_every_cell_of_a_paper_experiment_plans_as_the_paper_says(experiment):
    cells = jobs_by_cell(experiment)  # each cell's first launch or seed: they plan alike (below)
    table = {cell: verdict for name, cell, verdict, _ in PAPER if name == experiment}
    configs = compose_configs([jobs[0] for jobs in cells.values()])
    plans = {cell: plan_category(config) for cell, config in zip(cells, configs, strict=True)}
    assert set(plans) == set(table), "the file's grid is not the paper's table"
    disagree = {cell for cell, plan in plans.items() if not agrees(table[cell], plan)}
    assert disagree == {cell for name, cell in NEEDS_ACCUMULATION if name == experiment}


REPEATED = [e for e in PAPER_EXPERIMENTS if max(map(len, jobs_by_cell(e).values())) > 1]


@pytest.mark.parametrize("experiment", REPEATED)
def test_the_launches_and_seeds_of_a_cell_plan_alike(experiment):
    *_, jobs = jobs_by_cell(experiment).values()  # the last cell: the largest of most grids
    assert len({verdict_of(plan_setup(config)) for config in compose_configs(jobs)}) == 1


def test_the_table_cites_the_paper_for_every_cell():
    assert all(cite.startswith(("Table", "App.")) for *_, cite in PAPER)
    assert len({(name, cell) for name, cell, *_ in PAPER}) == len(PAPER) == 240


@pytest.mark.parametrize("tp", [16, 32])
def test_a_405b_cell_without_its_workaround_is_refused_naming_the_papers(tp):
    # block remat only, the engine's weights kept (what the cells hold without the workaround)
    kept = ["rollout.release_weights_during_training=false"] if tp == 16 else []
    cell = compose_config(
        [f"+scale_cell=llama3_1_405b_tp{tp}", "+experiment=scale_study", "trainer.remat=block"]
        + kept
    )
    with pytest.raises(ConfigError, match=r"the paper's own workaround: Table H1 fit 405B at TP"):
        check_fit(plan_setup(cell))
