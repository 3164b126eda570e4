"""The paper's grids as the plan reads them: which experiment files are the paper's, the cell a
job of one stands for, the category of its plan's verdict, and what the paper itself did where a
cell did not fit at first (the sentence a refusal of that cell adds, `planner.fit.check_fit`).

The cells themselves are the experiment files (experiments/experiment/), the one source: the
dry run, tools/plan_paper_cells.py and tests/test_paper_experiments.py expand their sweeps
(`locoexp.compose.sweep_jobs`). The paper's own workarounds are kept here because no setting
of locoexp reproduces them exactly (Table H1's 405B cells: a compiler flag, q/k/v remat).
"""

# The experiment files of the paper's grids (Tables 3, F1, H1, H2, E1-E3, I1, I5 (its frozen
# recipe too), App. I.2, B1, Section 4.1's 64-chip TP sweep, and App. G's MaxText Gemma4
# recipe, Table G1); each has a _cpu variant of the same shape.
PAPER_EXPERIMENTS = (
    "stack_comparison",
    "co_vs_da",
    "scale_study",
    "scale_controls",
    "tp_sweep_64",
    "model_size",
    "pathways_ratio",
    "cost_to_learn",
    "cost_to_learn_seeds",
    "cost_to_learn_frozen",
    "lever_ablation",
    "maxtext_gemma4_recipe",
)
# Overrides that repeat a cell (launches, seeds) or select the file, not part of its name.
REPEATS = ("launch=", "seed=", "+experiment=", "dry_run=")


def cell_of(job: list[str]) -> str:
    """A job's cell: its overrides' values, repeats (launch, seed) left out."""
    return " ".join(o.split("=", 1)[1] for o in job if not o.startswith(REPEATS))


def verdict_category(verdict: str) -> str:
    """ "fits", "fits with accumulation" (only by accumulating gradients over micro-batches,
    which the paper's trainer does not), or "refused" (`planner.report.verdict_of`)."""
    if verdict == "fits":
        return "fits"
    return "fits with accumulation" if verdict.startswith("fits with gradient") else "refused"


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
