"""Admission as the paper defines it (Section 4.3, Figure 7a, App. C Eq. 3): the admitting
process turns every request, each of the G samples of each prompt, into engine input one at a
time (chat template, tokenization, prompt cap) and submits it to the engine's request queue.

Eq. 3: d_adm = alpha0 + alpha1 * n for one process admitting n requests, or
max_h(alpha0 + alpha1 * n_h) when each host h admits its own n_h. Which process calls
`admit_requests` with which examples is the placement's business (the single controller: all
P * G requests in one process; `co` and `da` rollout hosts: their own share); this module only
does the per-request work and records what it did. It must not decide placement or touch devices.

`pretokenized=True` (`opt.pretokenize_prompts`) reuses the tokens made when the task loaded, so
each request costs one queue submission; that is a lever beyond the paper, off by default.

`AdmissionRendezvous` is the seam a test uses to check, under any load, that hosts admit in
parallel in their own processes (`LOCOEXP_ADMISSION_RENDEZVOUS`); runs without it never wait.
"""

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from locoexp.dataset.task import Example, Task
from locoexp.errors import unwritable
from locoexp.rollout.requests import Request, RequestQueue


@dataclasses.dataclass(frozen=True)
class AdmissionRecord:
    """What one admitting process did in one step (the records say which admission ran)."""

    requests: int
    pretokenized: bool
    pid: int  # the admitting process
    seconds: float  # perf_counter interval of the whole admission
    # CPU time of the admitting thread: the work itself, apart from waiting for a core (on a
    # machine whose cores are shared, wall time also counts other processes' turns).
    cpu_seconds: float
    first_submitted_ns: int  # Unix ns of the first and last submission (0 when none)
    last_submitted_ns: int

    def metrics(self) -> dict[str, float]:
        """Which admission ran and how much; its time is the step's `timing/admission_s`."""
        return {
            "admission/requests": self.requests,
            "admission/cpu_s": self.cpu_seconds,
            "admission/pretokenized": float(self.pretokenized),
        }


def admit_requests(
    task: Task,
    examples: Sequence[Example],
    *,
    group_size: int,
    queue: RequestQueue,
    pretokenized: bool,
    rendezvous: "AdmissionRendezvous | None" = None,
) -> tuple[list[np.ndarray], AdmissionRecord]:
    """Submit the G requests of every example to `queue`, one request at a time, in order
    (the G samples of a prompt stay contiguous: GRPO groups). Returns the submitted prompts
    ([N] token arrays, the host's own record of what it admitted) and what admission did.
    `rendezvous` (a test seam): meet the other hosts once the first request is submitted."""
    start, cpu_start = time.perf_counter(), time.thread_time()
    prompts, first, last = [], 0, 0
    for example in examples:
        for sample in range(group_size):
            tokens = example.prompt_tokens if pretokenized else task.encode_prompt(example)
            request = Request(prompt_tokens=tokens, example_id=example.id, sample=sample)
            queue.put(request)
            if rendezvous is not None and not prompts:
                rendezvous.meet()
            prompts.append(tokens)
            first, last = first or request.submitted_ns, request.submitted_ns
    return prompts, AdmissionRecord(
        requests=len(examples) * group_size,
        pretokenized=pretokenized,
        pid=os.getpid(),
        seconds=time.perf_counter() - start,
        cpu_seconds=time.thread_time() - cpu_start,
        first_submitted_ns=first,
        last_submitted_ns=last,
    )


class AdmissionLog:
    """Every step's `AdmissionRecord` of one admitting process, one JSON line per step, in
    `<run_dir>/admission/<role><index>.jsonl` (each host writes its own file: per-host submission
    times are what show serial against parallel admission, Figure 7a; metrics.jsonl holds only
    the reduction over hosts)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, step: int, record: AdmissionRecord) -> None:
        try:
            with self.path.open("a") as file:
                file.write(json.dumps({"step": step, **dataclasses.asdict(record)}) + "\n")
        except OSError as error:  # a full disk: one sentence, the records before it intact
            kept = "its earlier records and the run's checkpoints are intact"
            raise unwritable(self.path, error, kept=kept) from None


RENDEZVOUS_ENV = "LOCOEXP_ADMISSION_RENDEZVOUS"


@dataclasses.dataclass(kw_only=True)
class AdmissionRendezvous:
    """The hosts meet at the start of every admission: once its first request is submitted,
    host h marks `started-<h>-<n>` (its n-th admission) in `folder` and waits until every other
    host has marked its n-th. Hosts admitting at the same time meet at once; a host whose
    admission waits for another's to end (serial admission) never meets it and fails the run
    after `deadline_s`. Every other submission of a host then follows every other host's first,
    so the admission logs' overlap holds by construction, whatever the machine's load.

    Honoured by the admitting host processes of `co` and `single_controller` (not yet by `da`'s
    rollout actors) when `LOCOEXP_ADMISSION_RENDEZVOUS` names a folder
    (tests/test_admission_placement.py); unset, nothing waits."""

    folder: Path
    host: int
    hosts: int
    deadline_s: float = 120.0
    admissions: int = 0  # admissions met so far

    @classmethod
    def from_environment(cls, *, host: int, hosts: int) -> "AdmissionRendezvous | None":
        folder = os.environ.get(RENDEZVOUS_ENV)
        return cls(folder=Path(folder), host=host, hosts=hosts) if folder else None

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


def read_admission_logs(run_dir: Path) -> dict[str, list[dict]]:
    """`<role><index>` -> that process's records, from a run directory."""
    return {
        path.stem: [json.loads(line) for line in path.read_text().splitlines() if line]
        for path in sorted((Path(run_dir) / "admission").glob("*.jsonl"))
    }
