"""Reading finished runs: comparisons by the paper's Appendix A protocol. Never imports jax."""
