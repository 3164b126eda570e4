"""A run as one typed piece: `RunSpec` (what runs where, built once from the config) and
`run_session` (its lifecycle: open or resume, step, stop, checkpoint, export, finish), the same
for every placement."""
