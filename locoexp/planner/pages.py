"""The paged KV cache's plan (`rollout.kv_cache=paged`, issue 42 item 1): the pool and its slots.

A dense cache reserves P' + M slots per sequence, so its memory sets the slots. A paged engine
keeps a pool of pages per data-parallel replica that rows take as they grow and give back when
they end (locoexp/rollout/paged_slots.py), so the slots are the pool over what a row is
expected to hold: the dataset's mean sequence (`dataset.mean_sequence_tokens`, prompt plus
response; the caps where it is not given). The pool is `rollout.kv_cache_pages_per_replica` when
set; left null, on an accelerator it is the memory left on each device after the weights, the
trainer state a colocated device keeps and the engine's transients at that many slots, at most
every slot at its caps (no page beyond that could be taken); on a shared CPU machine (whose
processes share its memory) it is every slot at its caps, the engine's own null.

An expected length is a plan, not a promise: when the rows run longer than expected the pool
runs dry and the engine waits for pages, then preempts and recomputes a row (vLLM's rule), so
the plan stays safe, only slower. What the plan refuses is a pool that cannot hold one row at
its caps: that row could never finish (the engine and `Config` refuse it too).

Arithmetic only, as the rest of the planner; it reads sub-configs and scalars, never the root.
"""

import dataclasses

from locoexp.dataset.config import DatasetConfig
from locoexp.rollout.config import KVCacheKind, RolloutConfig
from locoexp.rollout.pages import pages_for


@dataclasses.dataclass(frozen=True, kw_only=True)
class PagePool:
    """A paged engine's planned pool per replica and the row length its slots are sized by."""

    pages: int  # per replica, per layer
    page_tokens: int
    bytes_per_device: int
    given: bool  # rollout.kv_cache_pages_per_replica set (else the plan's)
    expected_row_tokens: int  # prompt + response a row is expected to hold
    expected_source: str  # where that length comes from, for the report
    caps_tokens: int  # dataset.max_prompt_tokens + dataset.max_new_tokens

    @property
    def expected_row_pages(self) -> int:
        return pages_for(self.expected_row_tokens, self.page_tokens)

    @property
    def floor_pages(self) -> int:
        """One row at its caps: the least pool a run can finish every row with."""
        return pages_for(self.caps_tokens, self.page_tokens)

    @property
    def expected_rows(self) -> int:
        """Rows of the expected length the pool holds at once."""
        return self.pages // self.expected_row_pages

    @property
    def holds_one_row_at_caps(self) -> bool:
        return self.pages >= self.floor_pages

    def holds(self, per_replica: int) -> bool:
        """Whether `per_replica` slots of rows of the expected length fit the pool at once."""
        return per_replica <= self.expected_rows


def paged(rollout: RolloutConfig) -> bool:
    return rollout.kv_cache is KVCacheKind.paged


def expected_row(dataset: DatasetConfig) -> tuple[int, str]:
    """(tokens, where they come from) of the row length a paged plan sizes its slots by."""
    caps = dataset.max_prompt_tokens + dataset.max_new_tokens
    mean = dataset.mean_sequence_tokens
    if mean is None:
        return caps, (
            "the caps, dataset.max_prompt_tokens + dataset.max_new_tokens "
            "(dataset.mean_sequence_tokens=null)"
        )
    if mean > caps:
        return caps, f"the caps (dataset.mean_sequence_tokens={mean} is beyond them)"
    return mean, f"dataset.mean_sequence_tokens={mean}"


def pool_pages(
    rollout: RolloutConfig, *, per_replica: int, row_tokens: int, spare_bytes: int | None,
    page_bytes: int,
) -> int:  # fmt: skip
    """Pages per replica: `rollout.kv_cache_pages_per_replica`, or (null) the device memory
    left (`spare_bytes`, None on a shared CPU machine) in pages of `page_bytes`, at most
    `per_replica` slots of `row_tokens` (P' + M, the engine's own null) each."""
    if rollout.kv_cache_pages_per_replica is not None:
        return rollout.kv_cache_pages_per_replica
    at_caps = per_replica * pages_for(row_tokens, rollout.page_tokens)
    if spare_bytes is None:
        return at_caps
    return max(min(at_caps, spare_bytes // page_bytes), 0)


def build_pool(
    rollout: RolloutConfig, dataset: DatasetConfig, *, pages: int, page_bytes: int
) -> PagePool:
    """The plan's `PagePool` of `pages` pages per replica (`page_bytes` per page and device)."""
    tokens, source = expected_row(dataset)
    return PagePool(
        pages=pages,
        page_tokens=rollout.page_tokens,
        bytes_per_device=pages * page_bytes,
        given=rollout.kv_cache_pages_per_replica is not None,
        expected_row_tokens=tokens,
        expected_source=source,
        caps_tokens=dataset.max_prompt_tokens + dataset.max_new_tokens,
    )


def pool_origin(pool: PagePool, *, shared: bool, colocated: bool) -> str:
    """Where a plan's pool size comes from, for its report line and its refusal: the key, or
    (null) every slot at its caps on a shared CPU machine, else the memory each device has left."""
    if pool.given:
        return "rollout.kv_cache_pages_per_replica"
    if shared:
        return "rollout.kv_cache_pages_per_replica=null: every slot at its caps (hardware=cpu)"
    trainer = ", the trainer's params and AdamW" if colocated else ""
    return (
        "rollout.kv_cache_pages_per_replica=null: what each device has left beside the "
        f"weights{trainer} and the engine's transients, at most every slot at its caps"
    )
