"""Reading finished runs: the paper's comparisons (Appendix A), accounting (Appendix C, E.1),
cost-to-learn across seeds (Appendix I) and figures. `python -m locoexp.analysis <command>`.

Reads run directories only; never imports jax (nor Hydra): it runs where the results were
copied, on a laptop without accelerators.
"""
