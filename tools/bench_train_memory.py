"""The train step's compiled memory against row length, per attention kernel (issue 11).

    python tools/bench_train_memory.py [--lengths 1024 2048 4096 8192]
        [--kinds dense blockwise] [--remat none] [--micro-batch-rows 0] [--rows 1]

For `model=tiny_qwen` (conf/model/tiny_qwen.yaml, fp32, random init) and each row length L, one
packed batch of `--rows` rows, each holding one sequence of 256 prompt and L - 256 completion
tokens, goes through `Trainer.lower_step(...).compile().memory_analysis()`: XLA's own figures
for the jitted step (forward, backward, AdamW update). Nothing is executed. Temporaries are what
grows with L: dense attention keeps [heads, L, L] probabilities per layer (~L^2), blockwise
keeps per-block state (~L). The head's [chunk, V] logits are a constant floor.
"""

import argparse
import time
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh
from omegaconf import OmegaConf

from locoexp.algo.config import AlgoConfig
from locoexp.compose import use_cpu_backend
from locoexp.model.config import AttentionKind, ModelConfig, RematPolicy
from locoexp.model.transformer import build_model
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.packing import pack_sequences
from locoexp.trainer.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
PROMPT_TOKENS = 256
MIB = 2**20


def tiny_qwen() -> ModelConfig:
    return ModelConfig(**OmegaConf.to_container(OmegaConf.load(REPO / "conf/model/tiny_qwen.yaml")))


def row_batch(length: int, rows: int, vocab: int):
    """`rows` rows of one sequence each: 256 prompt + (L - 256) completion tokens."""
    rng = np.random.default_rng(0)
    completion = length - PROMPT_TOKENS
    prompts = [rng.integers(1, vocab, PROMPT_TOKENS).astype(np.int32) for _ in range(rows)]
    completions = [rng.integers(1, vocab, completion).astype(np.int32) for _ in range(rows)]
    behaviour = [np.full(completion, -1.0, np.float32)] * rows
    advantages = np.linspace(-1, 1, rows).astype(np.float32)
    return pack_sequences(prompts, completions, behaviour, advantages, row_tokens=length)


def step_memory(model_config, trainer_config, length: int, rows: int) -> dict:
    trainer = Trainer(
        build_model(model_config, seed=0),
        AlgoConfig(),
        trainer_config,
        mesh=Mesh(np.array(jax.devices()[:1]), ("fsdp",)),
        temperature=1.0,
        max_new_tokens=length - PROMPT_TOKENS,
    )
    start = time.perf_counter()
    compiled = trainer.lower_step(row_batch(length, rows, model_config.vocab_size)).compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    return {
        "temp_mib": memory.temp_size_in_bytes / MIB,
        "args_mib": memory.argument_size_in_bytes / MIB,
        "out_mib": memory.output_size_in_bytes / MIB,
        "compile_s": seconds,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--kinds", nargs="+", default=["dense", "blockwise"])
    parser.add_argument("--remat", default="none", choices=[p.value for p in RematPolicy])
    parser.add_argument("--micro-batch-rows", type=int, default=0)
    parser.add_argument("--rows", type=int, default=1)
    args = parser.parse_args()
    model_config = tiny_qwen()
    print(f"model=tiny_qwen rows={args.rows} remat={args.remat} micro={args.micro_batch_rows}")
    print(f"{'attention':>10} {'L':>6} {'temp MiB':>10} {'args MiB':>9} {'compile s':>9}")
    for kind in args.kinds:
        temps = []
        for length in args.lengths:
            config = TrainerConfig(
                attention=AttentionKind(kind),
                remat=RematPolicy(args.remat),
                micro_batch_rows=args.micro_batch_rows,
            )
            m = step_memory(model_config, config, length, args.rows)
            temps.append(m["temp_mib"])
            print(
                f"{kind:>10} {length:>6} {m['temp_mib']:>10.1f} {m['args_mib']:>9.1f} "
                f"{m['compile_s']:>9.1f}",
                flush=True,
            )
        growth = temps[-1] / temps[0]
        print(f"{kind:>10} temp growth {args.lengths[-1]}/{args.lengths[0]}: {growth:.1f}x")


if __name__ == "__main__":
    use_cpu_backend()  # CPU figures: JAX would try libtpu first where it is installed
    main()
