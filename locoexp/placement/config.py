"""Schema of the `placement` and `opt` config groups: execution mode and the O1-O4 levers. The
modes themselves (`PlacementKind`) and who runs where under each are `locoexp.layout`'s."""

import dataclasses

from locoexp.layout import PlacementKind


@dataclasses.dataclass(kw_only=True)
class PlacementConfig:
    kind: PlacementKind = PlacementKind.co
    ray_address: str | None = None  # placement=da: None = start a local Ray cluster on 127.0.0.1
    # placement=da: how often Ray restarts each rollout host whose process died (its actor's
    # `max_restarts`); the driver then regenerates the lost batch. A host that dies once more
    # ends the run. Trainer hosts are never restarted (their state is the checkpoint's).
    rollout_restarts: int = 3
    # placement=da: how long the driver waits for Ray to restart a rollout host (its actor's
    # `__init__` included) before the run stops with one sentence: a host whose node was lost
    # restarts on another node with a free CPU, and where none has one it would wait forever.
    rollout_restart_timeout_s: float = 600.0
    # placement=da: the staleness bound s (Eq. 4's "one-step-stale schedule"; the paper's is 1).
    # Batch t may be sampled with the weights of any update >= t - s, so each rollout host starts
    # its share of batch t as soon as its share of t-1 is done and those weights are published,
    # never waiting for the other rollout hosts: a slow host holds nobody back (Section 4.4).
    max_staleness: int = 1


@dataclasses.dataclass(kw_only=True)
class OptConfig:
    """Table B1's optimization levers (Appendix B); `opt=base` turns all off, `opt=optimized` on."""

    metrics_off_barrier: bool = False  # O1: export metrics off the per-host barrier
    freeze_gc: bool = False  # O2: gc.freeze() after warm-up, no collections on the step path
    balance_prompts: bool = False  # O3: balance prompts across hosts by prompt length
    publish_in_one_call: bool = False  # O4: all weights to the local engine in one call
    # Not a lever of Table B1: reuse the prompt tokens made when the task loaded, so admission
    # only submits requests. False is the paper's admission (Section 4.3, App. C Eq. 3): every
    # request is chat-rendered and tokenized one at a time by the process that admits it.
    pretokenize_prompts: bool = False
