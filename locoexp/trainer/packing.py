"""Pack phase (Algorithm 1, line 4): completed sequences -> fixed-length training rows.

Sequences (prompt + completion) are packed first-fit-decreasing into rows of `row_tokens`, each
with its own segment id and positions restarting at 0, so attention never crosses sequences and
packed equals unpacked. The loss needs log-probs only where a completion token is predicted; those
K positions are listed flat (`loss_index`), so the output head runs on K tokens, not R x L.

Row and slot counts are rounded up (`rows_multiple`, powers of two) so a run compiles few
shapes; hosts agree on the row count per device before training (`agree_rows`).
"""

import dataclasses
from collections.abc import Callable

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
        return self.tokens.shape[0]


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
    num_rows = per_device * rows_multiple
    total_completion = int(sum(len(c) for c in completions))
    slots = loss_slots or _next_power_of_two(max(total_completion, 1))
    if total_completion > slots:
        raise ValueError(f"{total_completion} completion tokens exceed {slots} loss slots")
    tokens = np.zeros((num_rows, row_tokens), np.int32)
    positions = np.zeros((num_rows, row_tokens), np.int32)
    segments = np.zeros((num_rows, row_tokens), np.int32)
    loss_index = np.zeros(slots, np.int32)
    loss_targets = np.zeros(slots, np.int32)
    loss_mask = np.zeros(slots, np.float32)
    loss_adv = np.zeros(slots, np.float32)
    loss_behaviour = np.zeros(slots, np.float32)
    k = 0
    for r, members in enumerate(bins):
        offset = 0
        for segment, n in enumerate(members, start=1):
            prompt, completion = prompts[n], completions[n]
            sequence = np.concatenate([prompt, completion])
            end = offset + len(sequence)
            tokens[r, offset:end] = sequence
            positions[r, offset:end] = np.arange(len(sequence))
            segments[r, offset:end] = segment
            c = len(completion)
            # position offset + len(prompt) - 1 + j predicts completion token j
            loss_index[k : k + c] = r * row_tokens + offset + len(prompt) - 1 + np.arange(c)
            loss_targets[k : k + c] = completion
            loss_mask[k : k + c] = 1.0
            loss_adv[k : k + c] = advantages[n]
            loss_behaviour[k : k + c] = behaviour_logprobs[n][:c]
            k += c
            offset = end
    return PackedBatch(
        tokens=tokens,
        positions=positions,
        segment_ids=segments,
        loss_index=loss_index,
        loss_targets=loss_targets,
        loss_mask=loss_mask,
        advantages=loss_adv,
        behaviour_logprobs=loss_behaviour,
        num_sequences=len(prompts),
    )
