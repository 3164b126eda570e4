"""The W1 benchmark's report: the figures `tools/bench_w1.py` measured, printed with their
verdicts against the targets of issue 2. It measures nothing and computes no figure itself.
"""

from locoexp.model.config import ModelConfig
from locoexp.model.sizes import count_block_matmul_parameters

TARGETS = {
    "rollout_roofline_min": 0.70,
    "step_over_floor_max": 1.5,
    "first_step_s_max": 30.0,
    "peak_rss_gb_max": 3.0,
}


def verdict(name: str, met: bool, detail: str) -> str:
    return f"  {name:<34} {'met' if met else 'NOT met':<8} {detail}"


def print_rates(r: dict) -> None:
    print("\n1. Matmul rate (fp32, median of timed repeats after warm-up):")
    for x in r["matmul"]:
        print(
            f"  {x['matmul']:<42} {x['backend']:<6} {x['seconds'] * 1e3:9.2f} ms  "
            f"{x['gflops']:8.1f} GFLOP/s"
        )
    print(
        f"  roofline denominator = best sustained rate: {r['roofline_gflops']:.1f} GFLOP/s "
        f"({r['roofline_source']})"
    )
    print(
        "  at the step's own matmul shapes (fastest timed call; XLA writing the product, XLA "
        "with it reduced in the same program ('fused'), NumPy; the shape floors divide each "
        "matmul's FLOPs by its shape's best rate):"
    )
    print(
        f"  {'shape':<30} {'used by':<26} {'XLA':>7} {'fused':>7} {'NumPy':>7} {'of roof':>8} "
        f"{'step GFLOP':>10}"
    )
    for x in sorted(r["shapes"], key=lambda x: -x["step_flops"]):
        print(
            f"  {x['shape']:<30} {','.join(x['used_by']):<26} {x['xla_gflops']:7.1f} "
            f"{x['xla_fused_gflops']:7.1f} {x['numpy_gflops']:7.1f} {x['of_roofline']:8.0%} "
            f"{x['step_flops'] / 1e9:10.2f}"
        )


def print_rollout(r: dict, m: ModelConfig) -> None:
    ro = r["rollout"]
    print(
        f"\n2. Rollout (JaxEngine.generate, 64 seqs x 64 prompt + 64 forced new tokens, T=1; "
        f"body {m.num_layers * count_block_matmul_parameters(m) / 1e6:.2f}M + head "
        f"{m.hidden_dim * m.vocab_size / 1e6:.2f}M matmul params):"
    )
    print(
        f"  wall {ro['seconds']:.2f} s (median)  {ro['tokens_per_s']:.0f} new tokens/s  "
        f"{ro['s_per_decode_iteration'] * 1e3:.1f} ms per decode iteration "
        f"({ro['decode_iterations']} iterations, prefill included); the engine's own clocks: "
        f"prefill {ro['engine_prefill_s'] * 1e3:.1f} ms, "
        f"{ro['engine_decode_s_per_iteration'] * 1e3:.1f} ms per decode iteration"
    )
    rf = ro["flops"]
    print(
        f"  FLOPs {rf['total'] / 1e9:.1f} G (prefill {rf['prefill'] / 1e9:.1f} G, decode "
        f"{rf['decode'] / 1e9:.1f} G) -> {rf['total'] / ro['seconds'] / 1e9:.1f} GFLOP/s = "
        f"{ro['roofline_fraction']:.1%} of the roofline; its shape floor "
        f"{ro['shape_floor_s']:.2f} s = {ro['shape_floor_fraction']:.1%} of the wall time"
    )


def print_step(r: dict) -> None:
    st = r["step"]
    tf = st["train_flops"]
    steps = st["steady_steps"]
    print(f"\n3. GRPO step (the step loop, medians of its {steps} steady steps, warm-up excluded):")
    for name, seconds in st["phases_s"].items():
        print(f"  {name:<12} {seconds:8.3f} s")
    print(f"  {'unaccounted':<12} {st['unaccounted_s']:8.3f} s")
    print(
        f"  {'step':<12} {st['step_s']:8.3f} s (the step's own decode s/iteration: "
        f"{st['step_decode_s_per_iteration'] * 1e3:.1f} ms)"
    )
    print(
        f"  CPU time of this process per step {st['cpu_s']:.1f} s = "
        f"{st['cpu_s'] / st['step_s']:.2f} cores busy on average (of {r['cpus']}; less means "
        "other processes took the rest)"
    )
    print(
        f"  compute floor = (rollout {st['rollout_flops'] / 1e9:.1f} G + train "
        f"{tf['total'] / 1e9:.1f} G) / rate = {st['floor_s']:.2f} s; step / floor = "
        f"{st['step_over_floor']:.2f}\n  shape floor (each matmul at its shape's rate) = "
        f"{st['shape_floor_s']:.2f} s (train {st['train_shape_floor_s']:.2f} s); step / shape "
        f"floor = {st['step_over_shape_floor']:.2f}\n  train = 3 x forward: body over all "
        f"{st['rows']} rows x L tokens {tf['forward_body'] / 1e9:.1f} G + output head on the K "
        f"loss positions only {tf['forward_head'] / 1e9:.1f} G (what the trainer computes)"
    )
    print(f"  reward mean per step: {', '.join(f'{x:.3f}' for x in st['reward_mean'])}")
    step0, first = st["first_step_record"], r["first_step_s"]
    print(
        f"\n4. Time to first step (process start -> end of step 0): {first:.1f} s = start-up "
        f"(imports, config, model init) {first - step0['timing/step_s']:.1f} s + step 0 "
        f"{step0['timing/step_s']:.1f} s (generation {step0['timing/generation_s']:.1f} s, "
        f"train {step0['timing/train_s']:.1f} s, compiles included)"
    )
    print(f"  peak RSS after the W1 steps {r['peak_rss_gb_run']:.2f} GB")


def print_report(r: dict, m: ModelConfig) -> None:
    print_rates(r)
    print_rollout(r, m)
    print_step(r)
    ro, st = r["rollout"], r["step"]
    print("\n5. Verdicts (CPU figures; the targets are against the square roofline):")
    fraction, ratio = ro["roofline_fraction"], st["step_over_floor"]
    checks = [
        (
            "rollout >= 70% of matmul roofline",
            fraction >= TARGETS["rollout_roofline_min"],
            f"{fraction:.1%} (its shape floor: {ro['shape_floor_fraction']:.1%})",
        ),
        (
            "GRPO step <= 1.5 x compute floor",
            ratio <= TARGETS["step_over_floor_max"],
            f"{st['step_s']:.2f} s / {st['floor_s']:.2f} s = {ratio:.2f}x "
            f"(shape floor: {st['step_over_shape_floor']:.2f}x)",
        ),
        (
            "time to first step <= 30 s",
            r["first_step_s"] <= TARGETS["first_step_s_max"],
            f"{r['first_step_s']:.1f} s",
        ),
        (
            "peak RSS <= 3 GB",
            r["peak_rss_gb_run"] <= TARGETS["peak_rss_gb_max"],
            f"{r['peak_rss_gb_run']:.2f} GB",
        ),
    ]
    for name, met, detail in checks:
        print(verdict(name, met, detail), flush=True)
