"""Tunix's own LoRA GRPO on workload W1, on this CPU: Tunix's side of App. G's comparison.

    /opt/tunix-venv/bin/python tools/bench_tunix_lora.py [--steps 2] [--rank 64] [--alpha 64]
        [--json PATH]

Runs in Tunix's virtualenv (google-tunix 0.1.7 with qwix, /opt/tunix-venv), not locoexp's: it
imports neither locoexp nor its dependencies. Everything of the run is Tunix's or qwix's:
`tunix.models.qwen3.model.Qwen3` at W1's configuration (random init), qwix's `LoraProvider`
applied with `qwix.apply_lora_to_model` (as Tunix's `cli/utils/model.py` does for its Qwen3 LoRA
GRPO recipe), `tunix.rl.rl_cluster.RLCluster` with the vanilla rollout engine (Tunix's `Sampler`),
colocated on one mesh (as its 4-chip recipe), and `tunix.rl.grpo.grpo_learner.GRPOLearner`.

W1 (`W1` below, the one place its constants live here; checked at start-up against the package's
own files, conf/model/tiny_qwen.yaml, conf/dataset/random_tokens.yaml, conf/adapter/lora.yaml and
experiments/experiment/bench_w1.yaml, and refused if they differ): the Qwen3 architecture at
V 151,936, D 256, F 768, 4 layers, 4 query / 2 KV heads, head_dim 64, tied embeddings, fp32;
8 prompts x 8 samples of 64 random prompt ids drawn as locoexp draws them ([2, V), seed 0), 64
forced new tokens, AdamW lr 1e-6 (locoexp's betas, eps, no weight decay, global-norm clip 1.0),
no KL (beta 0), one update per step (num_iterations 1), token-mean loss, temperature 1.

Two stand-ins, both because W1's prompts are ids with no text behind them:
- the tokenizer: Tunix's rollout takes prompt strings, so prompts are the ids in decimal and the
  stand-in (`IdTokenizer`) maps them back one to one, without a BOS (locoexp's `IdTokenizer`);
- forced length: Tunix's `Sampler` has no "ignore EOS" switch; it stops a row when it samples one
  of `eos_tokens`. EOS is set to V, an id outside the logits (ids 0..V-1), so it can never be
  sampled and every row runs to the 64-token cap (checked on every step's completions).
The reward is W1's own (the share of even ids in a completion, locoexp/dataset/random_tokens.py):
it differs within a group, so advantages are non-zero and the trainer does its full work.

Figures, all measured here: each step's wall time (host clock between the ends of consecutive
steps) and this process's CPU seconds, the phases Tunix's own perf tracer (v1) exposes per global
step (rollout, actor training, weight sync, the global step), the median over the steady steps
(after 2 warm-up steps, as locoexp.metrics.steady), time to first step and peak RSS
(resource.getrusage). It needs about 15 GB of free memory (peak RSS measured on 2026-12-03:
Tunix materialises W1's [64, 128, 151,936] fp32 training logits, experiments/LOG.md session 15).
"""

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
import optax
import qwix
import yaml
from flax import nnx
from process_stats import cpu_seconds, load_averages, peak_rss_gb, process_age_s  # this folder
from tunix.models.qwen3 import model as qwen3
from tunix.perf import export as perf_export
from tunix.perf import metrics as perf_metrics
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout

ROOT = Path(__file__).resolve().parent.parent
WARMUP_STEPS = 2  # locoexp.metrics.steady.WARMUP_STEPS: the first steps compile
PHASES = ("rollout", "actor_train", "weight_sync", "global_step")  # Tunix's perf v1 names
COLUMNS = ("step_s", "cpu_s", *PHASES)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True, kw_only=True)
class W1:
    """Workload W1 (tools/bench_w1.py, `+experiment=bench_w1`): every constant of it used here."""

    vocab_size: int = 151_936
    num_layers: int = 4
    hidden_dim: int = 256
    mlp_dim: int = 768
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    prompt_tokens: int = 64
    new_tokens: int = 64
    train_size: int = 64  # locoexp draws train_size + held_out_size prompts in one go
    held_out_size: int = 8
    learning_rate: float = 1e-6
    kl_coef: float = 0.0
    temperature: float = 1.0
    seed: int = 0
    # locoexp/algo/config.py's AdamW defaults (not in a YAML file)
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_eps: float = 0.2
    pad_id: int = 0  # locoexp's IdTokenizer; prompts are drawn from [2, V)

    @property
    def eos_id(self) -> int:
        """Outside the logits (ids 0..V-1): never sampled, so every row is forced to the cap."""
        return self.vocab_size


def conf_values(root: Path) -> dict[str, object]:
    """W1's constants as the package's own configuration files state them."""

    def read(path: str) -> dict:
        return yaml.safe_load((root / path).read_text())

    model = read("conf/model/tiny_qwen.yaml")
    data = read("conf/dataset/random_tokens.yaml")
    exp = read("experiments/experiment/bench_w1.yaml")
    adapter = read("conf/adapter/lora.yaml")
    keys = ("vocab_size", "num_layers", "hidden_dim", "mlp_dim", "num_heads", "num_kv_heads")
    values = {k: model[k] for k in (*keys, "head_dim", "rope_theta", "rms_norm_eps")}
    values.update(
        prompts_per_step=data["prompts_per_step"],
        samples_per_prompt=data["samples_per_prompt"],
        prompt_tokens=data["max_prompt_tokens"],
        new_tokens=data["max_new_tokens"],
        train_size=data["random_tokens"]["train_size"],
        held_out_size=data["random_tokens"]["held_out_size"],
        learning_rate=float(exp["algo"]["learning_rate"]),
        kl_coef=float(exp["algo"]["kl_coef"]),
        temperature=float(exp["rollout"]["temperature"]),
        seed=read("conf/config.yaml")["seed"],
    )
    checks = {"tie_embeddings": model["tie_embeddings"], "qk_norm": model["qk_norm"]}
    checks.update(ignore_eos=exp["rollout"]["ignore_eos"], targets=tuple(adapter["targets"]))
    return values | {"checks": checks}


def check_w1(w1: W1, root: Path) -> None:
    """Refuses to run when this file's W1 has drifted from the package's configuration."""
    stated = conf_values(root)
    checks = stated.pop("checks")
    drift = [
        f"{k}: here {getattr(w1, k)!r}, conf {v!r}"
        for k, v in stated.items()
        if getattr(w1, k) != v
    ]
    expected = {"tie_embeddings": True, "qk_norm": True, "ignore_eos": True, "targets": TARGETS}
    drift += [
        f"{k}: expected {v!r}, conf {checks[k]!r}" for k, v in expected.items() if checks[k] != v
    ]
    if drift:
        raise SystemExit(
            f"W1 in {__file__} differs from locoexp's configuration ({'; '.join(drift)})."
        )


class IdTokenizer:
    """W1's prompts are ids, written as decimal text; Tunix's rollout encodes them back."""

    def __init__(self, w1: W1):
        self.w1 = w1

    def encode(self, text: str, **_) -> list[int]:
        return [int(word) for word in text.split()]

    def decode(self, ids: Sequence[int], **_) -> str:
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self) -> None:
        return None  # W1 prompts carry no BOS

    def eos_id(self) -> int:
        return self.w1.eos_id

    def pad_id(self) -> int:
        return self.w1.pad_id


def w1_prompts(w1: W1, steps: int) -> list[dict[str, np.ndarray]]:
    """locoexp's draw (locoexp/dataset/random_tokens.py), 8 training prompts a step, in order
    (locoexp visits them in a seeded permutation; which ids a step gets does not change its work).
    An array, not a list: Tunix repeats each batch's leaves G times (`np.repeat`, axis 0)."""
    rng = np.random.default_rng(w1.seed)
    ids = rng.integers(
        2, w1.vocab_size, (w1.train_size + w1.held_out_size, w1.prompt_tokens), np.int32
    )
    train = [" ".join(map(str, row)) for row in ids[: w1.train_size]]
    n = w1.prompts_per_step
    batches = [[train[(s * n + i) % len(train)] for i in range(n)] for s in range(steps)]
    return [{"prompts": np.array(batch)} for batch in batches]


def even_share(prompts: list[str], completions: list[str], **_) -> list[float]:
    """W1's reward: the share of even ids in a completion."""
    del prompts
    return [float(np.mean([int(t) % 2 == 0 for t in c.split()])) if c else 0.0 for c in completions]


def build_lora_model(w1: W1, rank: int, alpha: float) -> nnx.Module:
    """Tunix's Qwen3 at W1's shape, random init, with qwix LoRA on W1's target projections."""
    config = qwen3.ModelConfig(
        num_layers=w1.num_layers,
        vocab_size=w1.vocab_size,
        embed_dim=w1.hidden_dim,
        hidden_dim=w1.mlp_dim,
        num_heads=w1.num_heads,
        head_dim=w1.head_dim,
        num_kv_heads=w1.num_kv_heads,
        rope_theta=int(w1.rope_theta),
        norm_eps=w1.rms_norm_eps,
        use_tied_embedding=True,
    )
    rngs = nnx.Rngs(w1.seed)
    model = qwen3.Qwen3(config, rngs=rngs)
    for layer in model.layers:  # Tunix initialises the MLP kernels to zeros; W1 is random
        for proj in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
            shape = proj.kernel.get_value().shape
            proj.kernel.set_value(0.02 * jax.random.normal(rngs.params(), shape))
    provider = qwix.LoraProvider(
        module_path="|".join(f".*{t}" for t in TARGETS), rank=rank, alpha=alpha
    )
    return qwix.apply_lora_to_model(model, provider, rngs=rngs, **model.get_model_input())


class StepClock:
    """Tunix's perf v1 export, called once per global step: its phase times, a host clock and
    this process's CPU seconds (the work a step did, whatever share of the cores it got)."""

    def __init__(self, cluster_config: rl_cluster_lib.ClusterConfig):
        self.export = perf_export.PerfMetricsExport.from_cluster_config(cluster_config)
        self.steps: list[dict[str, float]] = []
        self.begin()

    def begin(self) -> None:
        self.start, self.cpu = time.perf_counter(), cpu_seconds()

    def __call__(self, query: perf_metrics.PerfSpanQuery) -> perf_metrics.MetricsT:
        metrics = self.export(query)
        now, cpu = time.perf_counter(), cpu_seconds()
        self.steps.append(
            {
                "step_s": now - self.start,
                "cpu_s": cpu - self.cpu,
                "rollout": float(metrics["perf/sum/rollout_time"][0]),
                "actor_train": float(metrics["perf/sum/actor_train_time"][0]),
                "weight_sync": float(metrics["perf/weight_sync_time"][0]),
                "global_step": float(metrics["perf/global_step_time"][0]),
                "process_age_s": process_age_s(),
            }
        )
        self.start, self.cpu = now, cpu
        return metrics


def build_learner(
    w1: W1, model: nnx.Module, steps: int, lengths: "LengthCheck"
) -> tuple[grpo_learner.GRPOLearner, StepClock]:
    auto = (jax.sharding.AxisType.Auto,) * 2  # jax 0.10's default (Explicit) breaks Tunix's gather
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=auto)
    optimizer = optax.chain(
        optax.clip_by_global_norm(w1.max_grad_norm),
        optax.adamw(
            w1.learning_rate, w1.adam_b1, w1.adam_b2, w1.adam_eps, weight_decay=w1.weight_decay
        ),
    )
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=w1.new_tokens,
        max_prompt_length=w1.prompt_tokens,
        kv_cache_size=w1.prompt_tokens + w1.new_tokens,
        temperature=w1.temperature,
        top_p=1.0,
        top_k=None,
        eos_tokens=[w1.eos_id],
        seed=w1.seed,
    )
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={role: mesh for role in rl_cluster_lib.Role},
        rollout_engine="vanilla",
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optimizer, eval_every_n_steps=steps + 1, max_steps=steps
        ),
        rollout_config=rollout,
    )
    clock = StepClock(cluster_config)
    cluster = rl_cluster_lib.RLCluster(
        actor=model,
        tokenizer=IdTokenizer(w1),
        cluster_config=cluster_config,
        perf_config=perf_metrics.PerfMetricsConfig(custom_export_fn=clock),
    )
    algo = grpo_learner.GRPOConfig(
        num_generations=w1.samples_per_prompt,
        num_iterations=1,
        beta=w1.kl_coef,
        epsilon=w1.clip_eps,
        loss_agg_mode="token-mean",
    )
    return grpo_learner.GRPOLearner(cluster, algo, reward_fns=[even_share, lengths]), clock


class LengthCheck:
    """Counts completions shorter than the cap (they would mean EOS was sampled)."""

    def __init__(self, w1: W1):
        self.cap, self.short, self.rows = w1.new_tokens, 0, 0
        self.__name__ = "forced_length"  # Tunix logs each reward function by its name

    def __call__(self, prompts: list[str], completions: list[str], **_) -> list[float]:
        self.rows += len(completions)
        self.short += sum(len(c.split()) != self.cap for c in completions)
        return [0.0] * len(completions)


def available_memory_gb() -> float:
    """MemAvailable of /proc/meminfo, in GB (2**30 bytes)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024**2
    raise SystemExit("/proc/meminfo has no MemAvailable line: this tool needs Linux.")


def lora_params(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


def print_table(report: dict) -> None:
    """One row a step (seconds), then the median over the steady steps."""
    steps, steady = report["steps"], report["steady"]
    print("\n  step " + " ".join(f"{c:>12}" for c in COLUMNS))
    for i, s in enumerate(steps):
        mark = "" if i >= WARMUP_STEPS else "  (warm-up: compiles)"
        print(f"{i:>6} " + " ".join(f"{s[c]:>12.2f}" for c in COLUMNS) + mark)
    window = f"  (steps {WARMUP_STEPS}-{len(steps) - 1})"
    print("median " + " ".join(f"{steady[c]:>12.2f}" for c in COLUMNS) + window)
    print(
        f"time to first step {report['first_step_s']:.1f} s (process start to the end of step 0); "
        f"peak RSS {report['peak_rss_gb']:.2f} GB; LoRA parameters {report['lora_params']:,}; "
        f"completions short of {report['new_tokens']} tokens: {report['short_rows']} of "
        f"{report['rows']}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="timed steps after 2 warm-up steps")
    parser.add_argument(
        "--rank", type=int, default=64, help="LoRA rank (App. G's Tunix recipe: 64)"
    )
    parser.add_argument("--alpha", type=float, default=64.0, help="LoRA alpha (the recipe: 64)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--min-free-gb",
        type=float,
        default=16.0,
        help="refuse to start with less memory available (W1 under Tunix peaks at ~15.2 GB RSS)",
    )
    args = parser.parse_args(argv)
    for key in ("steps", "rank"):
        if getattr(args, key) < 1:
            parser.error(f"--{key}={getattr(args, key)} must be >= 1.")
    if args.alpha <= 0:
        parser.error(f"--alpha={args.alpha} must be > 0.")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    w1 = W1()
    check_w1(w1, ROOT)
    free_gb = available_memory_gb()
    if free_gb < args.min_free_gb:
        raise SystemExit(
            f"Only {free_gb:.1f} GB of memory is available and this run peaks at about 15 GB "
            f"(--min-free-gb={args.min_free_gb}): free memory first, or lower --min-free-gb."
        )
    import tunix  # noqa: PLC0415 (only for its version)

    print(
        f"Tunix LoRA GRPO on W1, CPU figures ({os.cpu_count()} CPUs, {jax.devices()[0].platform}, "
        f"jax {jax.__version__}, tunix {getattr(tunix, '__version__', '?')}); {load_averages()}",
        flush=True,
    )
    steps = WARMUP_STEPS + args.steps
    model = build_lora_model(w1, args.rank, args.alpha)
    lengths = LengthCheck(w1)
    learner, clock = build_learner(w1, model, steps, lengths)
    prompts = w1_prompts(w1, steps)
    clock.begin()
    learner.train(prompts)
    if len(clock.steps) != steps:
        raise SystemExit(f"Tunix ran {len(clock.steps)} global steps, not {steps}.")
    steady = clock.steps[WARMUP_STEPS:]
    report = {
        "steps": clock.steps,
        "steady": {k: statistics.median(s[k] for s in steady) for k in COLUMNS},
        "first_step_s": clock.steps[0]["process_age_s"],
        "peak_rss_gb": peak_rss_gb(),
        "lora_params": lora_params(learner.rl_cluster.actor_trainer.model),
        "rank": args.rank,
        "alpha": args.alpha,
        "new_tokens": w1.new_tokens,
        "short_rows": lengths.short,
        "rows": lengths.rows,
        "load_end": os.getloadavg(),
    }
    print_table(report)
    print(load_averages() + " (end)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
