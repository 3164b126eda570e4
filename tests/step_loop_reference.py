"""The golden records of the one step loop (`fixtures/step_loop_reference.json`, recorded at
commit cdec27f) and the overrides that reproduce them under today's key names."""

import json
from pathlib import Path

REFERENCE = json.loads((Path(__file__).parent / "fixtures/step_loop_reference.json").read_text())
# issue 27 gives each meaning of `eval_size` one name: the synthetic task's held-out prompts are
# `held_out_size` (the same 8 prompts as when the records were taken)
RENAMED_KEYS = {"dataset.synthetic.eval_size": "dataset.synthetic.held_out_size"}


def overrides_of(run: str) -> list[str]:
    """The common and the run's own overrides of the recorded run `run`, keys renamed."""
    overrides = [*REFERENCE["common_overrides"], *REFERENCE["runs"][run]["overrides"]]
    renamed = []
    for override in overrides:
        key, _, value = override.partition("=")
        renamed.append(f"{RENAMED_KEYS.get(key, key)}={value}")
    return renamed


def golden_steps(run: str) -> list[dict]:
    """The recorded run's per-step loss and reward, as `cli_runs.assert_same_steps` reads them."""
    values = REFERENCE["runs"][run]["steps"]
    return [
        {"step": t, "train/loss": loss, "rollout/reward_mean": values["rollout/reward_mean"][t]}
        for t, loss in enumerate(values["train/loss"])
    ]
