"""Run in a subprocess by tests/test_moe_expert_parallel.py, with 4 CPU devices set before jax
starts: the GRPO loss, metrics and gradients of one batch and the parameters after one update
from a one-device trainer (the reference) and from a 4-device trainer at EP2 (fsdp2 x expert2)
of a tiny Qwen3-MoE; then greedy and sampled rollouts (static waves: the fewest programs) of a
tiny Qwen3-MoE and a tiny Gemma4 MoE from a one-device engine and from a 4-device engine: the
Qwen3-MoE at EP2 (DP2), the Gemma4 at EP2 x TP2 (`ENGINE_LAYOUTS`). Both models route through
the one `expert_outputs`; the compiles are what this costs (minutes on a loaded 2-core machine),
hence one trainer layout and one model there, and one engine layout per model.
Writes them to an .npz file (argument 1)."""

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()

import dataclasses  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from moe_ep_cases import ENGINE_LAYOUTS, ENGINES, MAX_NEW, MODELS, TRAINERS  # noqa: E402
from test_moe_trainer import packed_batch  # noqa: E402
from tiny_policy import random_prompts  # noqa: E402

from locoexp.algo.config import AlgoConfig  # noqa: E402
from locoexp.model.transformer import build_model  # noqa: E402
from locoexp.rollout.config import RolloutConfig, SamplingParams, Scheduler  # noqa: E402
from locoexp.rollout.engine import JaxEngine  # noqa: E402
from locoexp.trainer.config import TrainerConfig  # noqa: E402
from locoexp.trainer.trainer import Trainer, trainer_mesh  # noqa: E402


def flat(tree, prefix: str) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(tree))
    return {f"{prefix}{jax.tree_util.keystr(p)}": np.asarray(v) for p, v in leaves}


def trainer_results(name: str, config, layout: str) -> dict[str, np.ndarray]:
    devices, ep, micro = TRAINERS[name][layout]
    trainer = Trainer(
        build_model(config, seed=0),
        AlgoConfig(learning_rate=1e-2, kl_coef=0.05),
        TrainerConfig(micro_batch_rows=micro, expert_parallel=ep),
        mesh=trainer_mesh(jax.devices()[:devices], ep),
        temperature=1.0,
        max_new_tokens=MAX_NEW,
    )
    (loss, metrics), grads = trainer.loss_and_grads(packed_batch())
    out = {"loss": np.asarray(loss), **{k: np.asarray(v) for k, v in metrics.items()}}
    out |= flat(grads, "grad")
    step = trainer.train_step(packed_batch())
    out |= {f"step/{k}": np.asarray(v) for k, v in step.items()} | flat(trainer.params, "param")
    stack = nnx.to_pure_dict(trainer.params)["layers"][0]
    stack = stack["experts" if config.gemma4 else "mlp"]["down_proj"]
    out["expert_shard_rows"] = np.asarray(stack.addressable_shards[0].data.shape[0])
    return {f"{name}/train/{layout}/{k}": v for k, v in out.items()}


def engine_results(name: str, config, layout: str) -> dict[str, np.ndarray]:
    devices, ep, tp = ENGINES[layout]
    engine = JaxEngine(
        build_model(dataclasses.replace(config, vocab_size=32), seed=1),
        RolloutConfig(expert_parallel=ep, tensor_parallel=tp, scheduler=Scheduler.waves),
        eos_id=-1,
        pad_id=0,
        devices=jax.devices()[:devices],
    )
    prompts = random_prompts([3, 9, 5, 7, 4, 6, 8, 2], seed=2, vocab=32)
    out = {"replicas": np.asarray(engine.replicas)}
    for label, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        rollout = engine.generate(
            prompts,
            key=jax.random.key(1),
            max_new_tokens=MAX_NEW,
            sampling=SamplingParams(temperature=temperature),
        )
        out |= {f"{label}_tokens": rollout.tokens, f"{label}_logprobs": rollout.logprobs}
    return {f"{name}/engine/{layout}/{k}": v for k, v in out.items()}


def main(path: str) -> None:
    results = {}
    for name, config in MODELS.items():
        for layout in TRAINERS[name]:
            results |= trainer_results(name, config, layout)
        for layout in ENGINE_LAYOUTS[name]:
            results |= engine_results(name, config, layout)
            print(name, layout, "done", flush=True)
    np.savez(path, **results)


if __name__ == "__main__":
    main(sys.argv[1])
