"""The Ray transport of a disaggregated layout (`placement=da`): everything of the run that only
Ray needs, beside the generic loop (`placement.loop`) and the in-process transport
(`placement.inprocess`), which never import it.

- `spec.py`: `RaySpec`, the cluster's knobs (address, restarts, object store); jax- and Ray-free,
  so a `RunSpec` holds it.
- `session.py`: Ray started (or joined) and stopped for the run; `watchdog.py` stops a local
  cluster's processes once the driver is gone.
- `hosts.py`: one actor per host wrapping the same halves as in-process.
- `transport.py`: `RayActors`, the `Transport` the driver's loop holds, with a lost rollout host's
  restart; `ledger.py` checks every batch is trained once; `saved_batches.py` keeps the batches in
  flight at a checkpoint.
"""
