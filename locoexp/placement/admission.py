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

`on_first_request` is called once an admission's first request is submitted (None: nothing);
tests meet the other hosts there to check, under any load, that hosts admit in parallel in their
own processes (tests/support/rendezvous.py).
"""

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
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
    on_first_request: Callable[[], None] | None = None,
) -> tuple[list[np.ndarray], AdmissionRecord]:
    """Submit the G requests of every example to `queue`, one request at a time, in order
    (the G samples of a prompt stay contiguous: GRPO groups). Returns the submitted prompts
    ([N] token arrays, the host's own record of what it admitted) and what admission did.
    `on_first_request`: called once, after the first request is submitted."""
    start, cpu_start = time.perf_counter(), time.thread_time()
    prompts: list[np.ndarray] = []
    first, last = 0, 0
    for example in examples:
        for sample in range(group_size):
            tokens = example.prompt_tokens if pretokenized else task.encode_prompt(example)
            request = Request(prompt_tokens=tokens, example_id=example.id, sample=sample)
            queue.put(request)
            if on_first_request is not None and not prompts:
                on_first_request()
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


def read_admission_logs(run_dir: Path) -> dict[str, list[dict]]:
    """`<role><index>` -> that process's records, from a run directory."""
    return {
        path.stem: [json.loads(line) for line in path.read_text().splitlines() if line]
        for path in sorted((Path(run_dir) / "admission").glob("*.jsonl"))
    }
