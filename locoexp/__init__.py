"""locoexp: declarative GRPO experiments for small language models in JAX (the LoCoJAX design).

The package is split by what each part owns: `model` (the Qwen3/Llama decoder), `rollout`
(generation engines), `algo` (GRPO math), `dataset` (tasks, prompts, rewards), `trainer`
(sharded train step), `placement` (the two halves of a step, the one step loop and its
transports), `metrics` (what a run records). `compose` turns Hydra YAML into the typed `Config`;
`main.run` is the single entry point that `run.py`, tools and tests call with it.
"""
