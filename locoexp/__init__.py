"""locoexp: declarative GRPO experiments for small language models in JAX (the LoCoJAX design).

The package is split by what each part owns: `model` (the Qwen3/Llama decoder), `rollout`
(generation engines), `algo` (GRPO math), `dataset` (tasks, prompts, rewards), `trainer`
(sharded train step), `placement` (how phases are laid out on hosts), `metrics` (what a run
records). `main.run` is the single entry point that `run.py` calls with a typed `Config`.
"""
