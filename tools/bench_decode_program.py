"""The engine's decode program alone at Table 1's GSM8K caps: CPU and wall time per iteration.

    python tools/bench_decode_program.py [--scheduler continuous] [--iterations 128]
        [--rounds 3] [--prompt-tokens 200] [--json PATH]

Issue 42's regression (generation 27 -> 37-39 s a step at 8 rows of 512 + 2,048 forced tokens)
hid in one product of the decode iteration, and whole runs on this shared 2-core machine move by
more than it. So this compiles the engine's `run` program (`model=tiny_qwen`, 8 slots, a prompt
bucket from `--prompt-tokens`, 2,048 new tokens: the cache of Table 1's caps) and times it
alone, `--rounds` calls of `--iterations` decode iterations each (per-request caps cut the
loop short; the cache and every shape stay those of 2,048 new tokens): wall and process CPU time
per iteration (CPU time moves less with other processes' load), min and median. It also counts
the dots of the optimised program that no fusion computes (XLA-CPU's plain dot: the regression
had 4 per iteration, one per layer). To compare commits, run it with PYTHONPATH at each
commit's worktree, interleaved. CPU figures only.
"""

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import jax
import numpy as np

from locoexp.compose import compose_config, use_cpu_backend
from locoexp.model.checkpoint import load_model
from locoexp.rollout.config import SamplingParams
from locoexp.rollout.engine import JaxEngine
from locoexp.rollout.scheduling import Call

ROWS, NEW_TOKENS = 8, 2048  # Table 1's GSM8K step: 2 prompts x 4 samples, 2,048 forced tokens


def unfused_dots(hlo: str) -> int:
    """Dots of optimised HLO text outside every fusion's computation."""
    fused = set(re.findall(r"kind=\w+, calls=(%[\w.-]+)", hlo))
    count, computation = 0, None
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and "{" in line:
            computation = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
        elif " dot(" in line and computation not in fused:
            count += 1
    return count


def decode_program(scheduler: str, iterations: int, prompt_tokens: int):
    """The compiled `run` program, a fresh-state maker and its requests."""
    config = compose_config(["model=tiny_qwen", "rollout.ignore_eos=true"])
    engine = JaxEngine(
        load_model(config.model, seed=0), config.rollout, eos_id=-1, pad_id=0,
        devices=jax.devices()[:1],
    )  # fmt: skip
    sampling = SamplingParams(temperature=1.0, ignore_eos=True)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 1000, prompt_tokens).astype(np.int32) for _ in range(ROWS)]
    start, run, requests = engine.wave_programs(
        prompts, max_new_tokens=NEW_TOKENS, sampling=sampling
    )
    if scheduler == "continuous":  # the first width's loop: refill on, floor at half
        prompt_len = requests.prompts.shape[1]
        chunk = min(config.rollout.prefill_chunk_tokens, prompt_len)
        call = Call(prompt_len, NEW_TOKENS, chunk, sampling)
        run = engine.slot_programs.jit("run", (call, ROWS, ROWS, ROWS // 2, True))
    requests = jax.device_put(requests._replace(caps=np.full(ROWS, iterations + 1, np.int32)))
    fresh = lambda: jax.block_until_ready(start(engine.params, requests, jax.random.key(0)))  # noqa: E731
    compiled = run.lower(engine.params, fresh(), requests).compile()
    return compiled, fresh, (engine.params, requests)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", choices=("waves", "continuous"), default="continuous")
    parser.add_argument("--iterations", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    compiled, fresh, (params, requests) = decode_program(
        args.scheduler, args.iterations, args.prompt_tokens
    )
    rounds = []
    for _ in range(args.rounds):
        state = fresh()
        wall, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(compiled(params, state, requests))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        rounds.append(
            {"wall_ms": 1e3 * wall / args.iterations, "cpu_ms": 1e3 * cpu / args.iterations}
        )
    report = {
        "scheduler": args.scheduler,
        "iterations": args.iterations,
        "unfused_dots": unfused_dots(compiled.as_text()),
        "rounds": rounds,
        **{
            f"{k}_ms_per_iteration_{f.__name__}": f(r[f"{k}_ms"] for r in rounds)
            for k in ("wall", "cpu")
            for f in (min, statistics.median)
        },
    }
    print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    use_cpu_backend()  # CPU figures: JAX would try libtpu first where it is installed
    main()
