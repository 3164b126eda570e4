"""Verifiable rewards: math answers checked with `math-verify`, SWE-agent actions by command.

Rewards compare text with a gold answer; model output is parsed, never executed or evaluated as
code. `scorer.RewardScorer` runs them in the host process or in a process pool (the paper's
family C, `dataset.reward_workers > 0`).
"""
