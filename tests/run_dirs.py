"""Run directories as `python run.py` leaves them (resolved config + metrics.jsonl), written
from given step times, for the analysis tests. Values are the test's; nothing is measured."""

import json
from pathlib import Path

import numpy as np
import yaml

PHASES = ("admission", "generation", "reward", "pack", "train", "publish", "log")


def write_run(
    run_dir: Path,
    step_s,
    *,
    placement: str = "co",
    hosts: int | None = 2,
    chips_per_host: int = 4,
    levers: bool = True,
    split: float | None = None,
    dataset: str = "gsm8k",
    launch: int = 0,
    seed: int = 0,
    passes: int = 2,
    prompt_tokens: float = 100.0,
    completion_tokens: float = 200.0,
    phases: dict[str, float] | None = None,
    evals: dict[int, float] | None = None,
    eval_target: float = 0.85,
    extra: dict | None = None,
    step_extra: dict[int, dict] | None = None,
    config: dict | None = None,
) -> Path:
    """One run: `step_s` is a step time per step (its length is the step count); `extra` adds
    keys to every step record, `step_extra` to the records of the steps it names."""
    steps = len(step_s)
    cfg = {
        "placement": {"kind": placement},
        "opt": {
            k: levers
            for k in ("metrics_off_barrier", "freeze_gc", "balance_prompts", "publish_in_one_call")
        },
        "hardware": {
            "hosts": hosts,
            "chips_per_host": chips_per_host,
            "chip_hour_price_usd": 0.0,
            # Hydra's file has no `chips`; W&B's resolved config adds it (run.py)
            **({} if hosts is None else {"chips": hosts * chips_per_host}),
        },
        "dataset": {"kind": dataset, "batches_per_pass": steps // passes, "passes": passes},
        "model": {"name": "qwen3_0_6b"},
        "rollout": {"tensor_parallel": 1},
        "split": split,
        "launch": launch,
        "seed": seed,
        "steps": steps,
        "eval_target": eval_target,
        "eval_at_updates": sorted(evals or []),
        **(config or {}),
    }
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines, elapsed = [], 60.0
    for step, seconds in enumerate(step_s):
        elapsed += seconds
        record = {
            "step": step,
            "time/elapsed_s": elapsed,
            "timing/step_s": float(seconds),
            "rollout/prompt_tokens_mean": prompt_tokens + (step % (steps // passes)),
            "rollout/completion_tokens_mean": completion_tokens,
            "rollout/completion_tokens_max": 2 * completion_tokens,
            "rollout/truncated_share": 0.0,
            "rollout/tokens_in": 2048 * prompt_tokens,
            "rollout/tokens_out": 2048 * completion_tokens,
            "rollout/reward_mean": step / steps,
            **{f"timing/{p}_s": v for p, v in (phases or {}).items()},
            **(extra or {}),
            **(step_extra or {}).get(step, {}),
        }
        lines.append(record)
        if evals and step + 1 in evals:
            lines.append(
                {"step": step, "eval/accuracy": evals[step + 1], "time/elapsed_s": elapsed}
            )
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return run_dir


def noisy(median: float, steps: int = 40, *, spread: float = 0.01, seed: int = 0) -> list[float]:
    """Step times around `median` (relative spread), the first steps slow (compilation)."""
    rng = np.random.default_rng(seed)
    times = median * (1 + spread * rng.standard_normal(steps))
    times[:2] = 10 * median
    return [float(t) for t in times]
