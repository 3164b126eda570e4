"""`adapter=lora` under both publication paths: the engines sample with the adapted policy.

Publication merges the adapters into the base (W + (alpha / r) A B, `Trainer.params`) beside the
embedding trained in full (`adapter.modules_to_save`), so under co (staleness 0) the trainer's
recomputed log-probs equal the sampler's at every step, while the KL term against the base (the
initial policy) shows the policy moved; a sampler still holding the base weights would show a
gap as large as that KL. Under da (through Ray's object store, one step
stale) the run completes with the adapters moving the policy. The merge is the trainer's, before
any placement's publication: single_controller's publication of merged weights is its plain
one (test_step_loop), so it is not run again here.
"""

import numpy as np
import pytest

from locoexp.compose import compose_config
from locoexp.main import run
from locoexp.metrics.run_records import read_metrics_jsonl

pytestmark = pytest.mark.slow
STEPS = 3
COMMON = [
    "logger=none", "seed=0", f"steps={STEPS}", "eval_every_steps=0", "checkpoint_every_steps=0",
    "dataset.prompts_per_step=4", "dataset.samples_per_prompt=4",
    "dataset.synthetic.held_out_size=8",
    "adapter=lora", "adapter.rank=8", "adapter.alpha=16", "algo.learning_rate=3e-2",
    "adapter.modules_to_save=[embed_tokens]",  # trained in full, published with the adapters
    "algo.kl_coef=0.05",
]  # fmt: skip
PLACEMENTS = {
    "co": ["placement=co", "hardware.hosts=2"],
    "da": ["placement=da", "split=0.5", "hardware.hosts=2"],
}


@pytest.fixture(scope="module", params=list(PLACEMENTS))
def lora_run(request, tmp_path_factory):
    config = compose_config([*COMMON, *PLACEMENTS[request.param]])
    run_dir = tmp_path_factory.mktemp(request.param)
    run(config, run_dir=run_dir, progress=False)
    records = read_metrics_jsonl(run_dir / "metrics.jsonl")
    return request.param, [r for r in records if "eval/accuracy" not in r], run_dir


def test_lora_run_trains_every_step_and_moves_off_the_base(lora_run):
    _, records, _ = lora_run
    assert [r["step"] for r in records] == list(range(STEPS))
    assert all(np.isfinite(r["train/loss"]) for r in records)
    assert records[0]["train/kl"] < 1e-6  # B = 0: the adapted policy starts as the base
    assert records[-1]["train/kl"] > 1e-4  # ... and the adapters moved it


def test_engines_sample_with_the_adapted_policy(lora_run):
    placement, records, _ = lora_run
    fresh = records if placement != "da" else records[:1]  # da: step 0 shares the weights
    for record in fresh:
        assert record["train/sampler_logprob_gap"] < 1e-4, (placement, record["step"])
    if placement != "da":  # the gap is far below what a base-model sampler would show
        assert records[-1]["train/sampler_logprob_gap"] < 0.1 * records[-1]["train/kl"]
