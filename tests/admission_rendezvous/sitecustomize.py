"""Test instrument, loaded only by the host processes of a test that puts this folder on
PYTHONPATH and names a folder in `LOCOEXP_ADMISSION_RENDEZVOUS` (tests/test_admission_placement.py).

At the first request of each admission (a put on an empty `RequestQueue`), the host marks that it
has started its n-th admission, then waits until every other host has started its n-th too.
Hosts that admit at the same time meet at once and go on; a host whose admission waited for
another's to end (serial admission) never meets its peer and fails the run at the deadline. The
test's overlap check then holds by construction when admission is parallel, whatever the load."""

import os
import time
from pathlib import Path

from locoexp.rollout.requests import RequestQueue

DEADLINE_S = 120.0


def _meet(folder: Path, admission: int) -> None:
    import jax  # noqa: PLC0415  (the host's jax.distributed group is up by its first admission)

    me, hosts = jax.process_index(), jax.process_count()
    (folder / f"started-{me}-{admission}").touch()
    others = [folder / f"started-{h}-{admission}" for h in range(hosts) if h != me]
    deadline = time.monotonic() + DEADLINE_S
    while not all(path.exists() for path in others):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"host {me} started admission {admission} and waited {DEADLINE_S:.0f} s for "
                "the other hosts to start theirs: admission is not parallel"
            )
        time.sleep(0.005)


def _install(folder: Path) -> None:
    put, admissions = RequestQueue.put, [0]

    def put_after_meeting(queue: RequestQueue, request) -> None:
        if len(queue) == 0:  # the first request of this admission: the queue drains each step
            _meet(folder, admissions[0])
            admissions[0] += 1
        put(queue, request)

    RequestQueue.put = put_after_meeting


if os.environ.get("LOCOEXP_ADMISSION_RENDEZVOUS"):
    _install(Path(os.environ["LOCOEXP_ADMISSION_RENDEZVOUS"]))
