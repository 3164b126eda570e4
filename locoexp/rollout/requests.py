"""The engine's request queue: admission puts requests in one at a time, generation drains it.

This is the hand-over point the paper's admission ends at (Section 4.3, Figure 7a: the head
"tokenizes the batch and adds all 2,048 requests one at a time"). A `Request` is engine input:
prompt token ids plus which prompt and which of its G samples it is. The queue is a plain FIFO
(`collections.deque`, whose appends and pops are atomic), owned by the process that admits and
generates; it never crosses processes and holds no device arrays.
"""

import collections
import dataclasses
import time

import numpy as np


@dataclasses.dataclass(frozen=True)
class Request:
    """One completion to generate: the `sample`-th of G samples of prompt `example_id`."""

    prompt_tokens: np.ndarray  # [P] int32, chat-rendered and capped
    example_id: int
    sample: int
    # Wall clock (Unix ns) when it entered the queue: comparable across local host processes.
    submitted_ns: int = dataclasses.field(default_factory=time.time_ns)


class RequestQueue:
    """FIFO of admitted requests; `drain` hands every queued request to the engine in order."""

    def __init__(self) -> None:
        self._pending: collections.deque[Request] = collections.deque()

    def put(self, request: Request) -> None:
        self._pending.append(request)

    def drain(self) -> list[Request]:
        """Every queued request, oldest first; the queue is empty afterwards."""
        drained = []
        while self._pending:
            drained.append(self._pending.popleft())
        return drained

    def __len__(self) -> int:
        return len(self._pending)
