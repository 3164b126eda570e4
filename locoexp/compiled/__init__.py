"""XLA decides what fits: a run's programs compiled for its TPU slice on any machine.

`topology` (a TPU slice's devices from libtpu, no TPU needed), `programs` (every program of the
trainer and an engine, built abstractly and compiled), `verdict` (sizes at the model's depth,
each role's peak per device and the fit), `report` (the `dry_run=compile` text), `startup`
(the start-up fit check: XLA decides where the plan could be wrong).
"""
