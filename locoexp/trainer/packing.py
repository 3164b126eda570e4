"""Pack phase (Algorithm 1, line 4): completed sequences -> fixed-length training rows.

Sequences (prompt + completion) are packed first-fit-decreasing into rows of `row_tokens`, each
with its own segment id and positions restarting at 0, so attention never crosses sequences and
packed equals unpacked. The loss needs log-probs only where a completion token is predicted; those
K positions are listed flat (`loss_index`), so the output head runs on K tokens, not R x L.

Row and slot counts are rounded up (`rows_multiple`, powers of two) so a run compiles few
shapes; hosts agree on the row count per device before training (`agree_rows`).

Two types: `PackedBatch` is one process's host-side result (NumPy arrays plus the sequence
count); `TrainBatch` is the jitted train step's argument, a registered pytree whose leaves are
all arrays (the sequence count enters it as the traced `normalizer`, so no leaf is static
metadata and a changed count does not recompile). This module packs; it never places arrays on
devices (the trainer does) and never computes a loss.

Shapes: N sequences, R rows, L row tokens, K loss slots.
"""

import dataclasses
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class PackedBatch:
    tokens: np.ndarray  # [R, L] int32
    positions: np.ndarray  # [R, L] int32
    segment_ids: np.ndarray  # [R, L] int32, 0 = padding
    loss_index: np.ndarray  # [K] int32, flat index r * L + i of the position predicting a target
    loss_targets: np.ndarray  # [K] int32, the completion token predicted there
    loss_mask: np.ndarray  # [K] float32, 0 for padding slots
    advantages: np.ndarray  # [K] float32, the sequence's advantage on each of its tokens
    behaviour_logprobs: np.ndarray  # [K] float32, the sampler's log-probs
    num_sequences: int

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])


# What a batch pytree holds in each field: host or device arrays, or, mapped over the same
# structure, their shardings or abstract shapes (`Trainer.batch_shardings`, `abstract_batch`).
Leaf = TypeVar("Leaf")


class PackedRows(NamedTuple, Generic[Leaf]):
    """The decoder's input: packed rows, each array [R, L] int32 (a pytree; micro-batches split
    every leaf along rows)."""

    tokens: Leaf
    positions: Leaf
    segment_ids: Leaf  # 0 = padding


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainBatch(Generic[Leaf]):
    """The train step's batch as one pytree: the fields of `PackedBatch` over every process
    (global arrays inside the step, host arrays before placement), no static metadata."""

    tokens: Leaf  # [R, L] int32
    positions: Leaf  # [R, L] int32
    segment_ids: Leaf  # [R, L] int32, 0 = padding
    loss_index: Leaf  # [K] int32, flat index into the global [R, L] rows
    loss_targets: Leaf  # [K] int32
    loss_mask: Leaf  # [K] float32
    advantages: Leaf  # [K] float32
    behaviour_logprobs: Leaf  # [K] float32
    # [] float32: sequences x max_new_tokens over all processes, the `constant` aggregation's
    # divisor (Dr. GRPO); traced, so a batch with another sequence count reuses the program
    normalizer: Leaf
    # [K] float32: the KL reference's log-probs, filled inside the step when the loss has a KL
    # term; None (an empty subtree) otherwise
    ref_logprobs: Leaf | None = None

    @property
    def rows(self) -> PackedRows[Leaf]:
        return PackedRows(self.tokens, self.positions, self.segment_ids)


ROW_FIELDS = PackedRows._fields  # TrainBatch's fields of shape [R, L]; the others are [K] or []


def train_view(
    batch: PackedBatch, *, normalizer: float, index_offset: int = 0
) -> TrainBatch[np.ndarray]:
    """This process's part of the step's `TrainBatch` (host arrays): `index_offset` is where its
    rows start in the global flat [R, L] layout (process p of equal shares: p * R * L)."""
    return TrainBatch(
        tokens=batch.tokens,
        positions=batch.positions,
        segment_ids=batch.segment_ids,
        loss_index=batch.loss_index + np.int32(index_offset),
        loss_targets=batch.loss_targets,
        loss_mask=batch.loss_mask,
        advantages=batch.advantages,
        behaviour_logprobs=batch.behaviour_logprobs,
        normalizer=np.asarray(normalizer, np.float32),  # [] as a 0-d array, like every host leaf
    )


def _next_power_of_two(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


def count_rows(sequence_lengths: np.ndarray, row_tokens: int) -> list[list[int]]:
    """First-fit-decreasing bins of sequence indices whose lengths fit in `row_tokens`."""
    rows: list[list[int]] = []
    free: list[int] = []
    for n in np.argsort(-sequence_lengths, kind="stable"):
        length = int(sequence_lengths[n])
        for r, space in enumerate(free):
            if length <= space:
                rows[r].append(int(n))
                free[r] -= length
                break
        else:
            rows.append([int(n)])
            free.append(row_tokens - length)
    return rows


def _empty_batch(rows: int, row_tokens: int, slots: int, *, num_sequences: int) -> PackedBatch:
    """Zeroed arrays: segment 0 and loss mask 0 mark padding rows, tokens and slots."""

    def grid() -> np.ndarray:
        return np.zeros((rows, row_tokens), np.int32)

    def flat(dtype: type[np.generic]) -> np.ndarray:
        return np.zeros(slots, dtype)

    return PackedBatch(
        tokens=grid(),
        positions=grid(),
        segment_ids=grid(),
        loss_index=flat(np.int32),
        loss_targets=flat(np.int32),
        loss_mask=flat(np.float32),
        advantages=flat(np.float32),
        behaviour_logprobs=flat(np.float32),
        num_sequences=num_sequences,
    )


def _place_sequence(
    batch: PackedBatch,
    *,
    row: int,
    offset: int,
    segment: int,
    slot: int,
    prompt: np.ndarray,
    completion: np.ndarray,
    behaviour_logprobs: np.ndarray,
    advantage: float,
) -> int:
    """Write one sequence into row `row` at `offset` and its completion tokens into the loss
    slots from `slot` on (filling a freshly built batch in place); returns the next free slot."""
    sequence = np.concatenate([prompt, completion])
    end, c, width = offset + len(sequence), len(completion), batch.tokens.shape[1]
    batch.tokens[row, offset:end] = sequence
    batch.positions[row, offset:end] = np.arange(len(sequence))
    batch.segment_ids[row, offset:end] = segment
    loss = slice(slot, slot + c)
    # position offset + len(prompt) - 1 + j predicts completion token j
    batch.loss_index[loss] = row * width + offset + len(prompt) - 1 + np.arange(c)
    batch.loss_targets[loss] = completion
    batch.loss_mask[loss] = 1.0
    batch.advantages[loss] = advantage
    batch.behaviour_logprobs[loss] = behaviour_logprobs[:c]
    return slot + c


def pack_sequences(
    prompts: list[np.ndarray],
    completions: list[np.ndarray],
    behaviour_logprobs: list[np.ndarray],
    advantages: np.ndarray,
    *,
    row_tokens: int,
    rows_multiple: int = 1,
    agree_rows: Callable[[int], int] = lambda rows: rows,
    loss_slots: int | None = None,
) -> PackedBatch:
    """Pack N sequences; `loss_slots` fixes K (default: the completion tokens, rounded up).

    `agree_rows` maps this host's row count to the count every host pads to (their maximum);
    it is where the hosts exchange shapes."""
    lengths = np.array([len(p) + len(c) for p, c in zip(prompts, completions, strict=True)])
    if lengths.max() > row_tokens:
        raise ValueError(f"a sequence of {lengths.max()} tokens does not fit rows of {row_tokens}")
    bins = count_rows(lengths, row_tokens)
    per_device = _next_power_of_two(-(-agree_rows(len(bins)) // rows_multiple))
    total_completion = int(sum(len(c) for c in completions))
    slots = loss_slots or _next_power_of_two(max(total_completion, 1))
    if total_completion > slots:
        raise ValueError(f"{total_completion} completion tokens exceed {slots} loss slots")
    batch = _empty_batch(per_device * rows_multiple, row_tokens, slots, num_sequences=len(prompts))
    slot = 0
    for row, members in enumerate(bins):
        offset = 0
        for segment, n in enumerate(members, start=1):
            slot = _place_sequence(
                batch,
                row=row,
                offset=offset,
                segment=segment,
                slot=slot,
                prompt=prompts[n],
                completion=completions[n],
                behaviour_logprobs=behaviour_logprobs[n],
                advantage=advantages[n],
            )
            offset += int(lengths[n])
    return batch
