"""The expert-parallel layouts tests/moe_ep_worker.py runs and tests/test_moe_expert_parallel.py
checks. Kept apart from the worker: importing the worker sets its 4-device `XLA_FLAGS`, which in
a pytest worker would give every later in-process test 4 devices (conftest refuses that)."""

from test_moe_trainer import GEMMA4_MOE, MOE

MODELS = {"qwen3_moe": MOE, "gemma4_moe": GEMMA4_MOE}
# layout: (devices, EP, micro_batch_rows), by model
TRAINERS = {"qwen3_moe": {"one_device": (1, 1, 0), "ep2": (4, 2, 0)}, "gemma4_moe": {}}
ENGINES = {"one_device": (1, 1, 1), "ep2": (4, 2, 1), "ep2_tp2": (4, 2, 2)}  # devices, EP, TP
# Each model's engine at one expert-parallel layout (both route through the one
# `expert_outputs`; every layout costs its compiles): Qwen3-MoE at EP2 x DP2, Gemma4 at EP2 x TP2.
ENGINE_LAYOUTS = {"qwen3_moe": ("one_device", "ep2"), "gemma4_moe": ("one_device", "ep2_tp2")}
MAX_NEW = 6
