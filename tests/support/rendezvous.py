"""Hosts that meet at the start of every admission, to check that `co` hosts admit in parallel
in their own processes whatever the machine's load (tests/test_admission_placement.py).

`AdmissionRendezvous.meet` is what a rollout half calls once an admission's first request is
submitted (`RolloutHalf.on_first_request`, the seam the package offers); `run_session_meeting`
is `locoexp.session.lifecycle.run_session` in a local host process whose rollout half meets the
other hosts in a folder. Nothing here is in the wheel, and no environment variable carries it.
"""

import dataclasses
import time
from pathlib import Path


@dataclasses.dataclass(kw_only=True)
class AdmissionRendezvous:
    """Once its first request is submitted, host h marks `started-<h>-<n>` (its n-th admission)
    in `folder` and waits until every other host has marked its n-th. Hosts admitting at the same
    time meet at once; a host whose admission waits for another's to end (serial admission) never
    meets it and fails the run after `deadline_s`. Every other submission of a host then follows
    every other host's first, so the admission logs' overlap holds by construction."""

    folder: Path
    host: int
    hosts: int
    deadline_s: float = 120.0
    admissions: int = 0  # admissions met so far

    def meet(self) -> None:
        n, self.admissions = self.admissions, self.admissions + 1
        (self.folder / f"started-{self.host}-{n}").touch()
        others = [self.folder / f"started-{h}-{n}" for h in range(self.hosts) if h != self.host]
        deadline = time.monotonic() + self.deadline_s
        while not all(path.exists() for path in others):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"host {self.host} started admission {n} and waited {self.deadline_s:.0f} s "
                    "for the other hosts to start theirs: admission is not parallel"
                )
            time.sleep(0.005)


def run_session_meeting(spec, files, folder: str) -> None:
    """`run_session(spec, files)` in this host process, its admissions meeting the other hosts'
    in `folder` (the target of `launch_local_processes`)."""
    from locoexp.placement import build  # noqa: PLC0415  (in the host process, after its jax set-up)
    from locoexp.session.lifecycle import run_session  # noqa: PLC0415

    in_process = build.build_in_process

    def meeting(halves, task, schedule, group, timer):
        transport = in_process(halves, task, schedule, group, timer)
        rendezvous = AdmissionRendezvous(folder=Path(folder), host=group.index, hosts=group.count)
        transport.rollout.on_first_request = rendezvous.meet
        return transport

    build.build_in_process = meeting  # this host process's own module: its transport meets
    run_session(spec, files)
