"""Packing: several sequences per row give the log-probs of one sequence per row (fp32, 1e-5).

Sequences are identified inside packed rows by their content alone (segment ids, then the tokens
of the segment), so the checks do not rely on the packer's own bookkeeping.
"""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from tiny_policy import random_prompts, reference_logprobs, tiny_model

from locoexp.algo.config import AlgoConfig
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.packing import PackedBatch, TrainBatch, pack_sequences
from locoexp.trainer.trainer import Trainer

TEMPERATURE = 0.7
N = 10


@pytest.fixture(scope="module")
def sequences():
    """Prompts of 4-7 and completions of 5-8 tokens: 9-15 tokens, so rows of 16 hold one each."""
    rng = np.random.default_rng(0)
    prompts = random_prompts(rng.integers(4, 8, N), seed=1)
    completions = random_prompts(rng.integers(5, 9, N), seed=2)
    behaviour = [rng.uniform(-3, -0.1, len(c)).astype(np.float32) for c in completions]
    advantages = rng.normal(size=N).astype(np.float32)
    return prompts, completions, behaviour, advantages


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def trainer(model):
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    return Trainer(
        model,
        AlgoConfig(learning_rate=1e-3),
        TrainerConfig(logit_chunk_tokens=16),
        mesh=mesh,
        temperature=TEMPERATURE,
        max_new_tokens=8,
    )


def pack(sequences, row_tokens: int) -> PackedBatch:
    prompts, completions, behaviour, advantages = sequences
    return pack_sequences(prompts, completions, behaviour, advantages, row_tokens=row_tokens)


def locate(batch: PackedBatch, sequences) -> list[tuple[int, int, int, int]]:
    """For each real loss slot: (sequence n, completion index j, row, segment start)."""
    prompts, completions = sequences[0], sequences[1]
    whole = [np.concatenate([p, c]) for p, c in zip(prompts, completions, strict=True)]
    width = batch.tokens.shape[1]
    found = []
    for k in np.flatnonzero(batch.loss_mask):
        row, i = divmod(int(batch.loss_index[k]), width)
        segment = batch.segment_ids[row, i]
        cols = np.flatnonzero(batch.segment_ids[row] == segment)
        matches = [n for n, s in enumerate(whole) if np.array_equal(batch.tokens[row, cols], s)]
        assert len(matches) == 1, f"slot {k}: segment is not exactly one input sequence"
        n = matches[0]
        found.append((n, i - cols[0] - (len(prompts[n]) - 1), row, cols[0]))
    return found


def test_no_sequence_crosses_rows(sequences):
    batch = pack(sequences, row_tokens=32)
    prompts, completions = sequences[0], sequences[1]
    seen = []
    for row in range(batch.rows):
        segments = batch.segment_ids[row]
        for segment in sorted(set(segments[segments > 0].tolist())):
            cols = np.flatnonzero(segments == segment)
            assert np.array_equal(cols, np.arange(cols[0], cols[-1] + 1)), "segment not contiguous"
            np.testing.assert_array_equal(batch.positions[row, cols], np.arange(len(cols)))
            seen.append(tuple(batch.tokens[row, cols]))
    expected = [tuple(np.concatenate([p, c])) for p, c in zip(prompts, completions, strict=True)]
    assert sorted(seen) == sorted(expected)  # every sequence exactly once, whole, in one row
    assert batch.rows < N  # several per row


def test_loss_index_points_at_the_position_predicting_each_completion_token(sequences):
    batch = pack(sequences, row_tokens=32)
    prompts, completions, behaviour, advantages = sequences
    real = np.flatnonzero(batch.loss_mask)
    assert len(real) == sum(len(c) for c in completions)
    assert (batch.loss_mask[len(real) :] == 0).all()
    covered = set()
    for k, (n, j, row, start) in zip(real, locate(batch, sequences), strict=True):
        i = int(batch.loss_index[k]) % batch.tokens.shape[1]
        assert i == start + len(prompts[n]) - 1 + j  # the position before completion token j
        assert 0 <= j < len(completions[n])
        assert batch.loss_targets[k] == completions[n][j] == batch.tokens[row, i + 1]
        assert batch.advantages[k] == advantages[n]
        assert batch.behaviour_logprobs[k] == behaviour[n][j]
        covered.add((n, j))
    assert len(covered) == len(real)


def test_packed_logprobs_equal_one_sequence_per_row(sequences, trainer, model):
    packed, unpacked = pack(sequences, row_tokens=32), pack(sequences, row_tokens=16)
    assert packed.rows < N and unpacked.rows >= N  # rows of 16 cannot hold two sequences
    reference = reference_logprobs(model, sequences[0], sequences[1], temperature=TEMPERATURE)
    by_token = {}
    for batch in (packed, unpacked):
        logprobs = trainer.logprobs(batch)
        slots = np.flatnonzero(batch.loss_mask)
        by_token[batch.rows] = {
            (n, j): logprobs[k]
            for k, (n, j, _, _) in zip(slots, locate(batch, sequences), strict=True)
        }
        for (n, j), value in by_token[batch.rows].items():
            assert value == pytest.approx(reference[n][j], abs=1e-5), (batch.rows, n, j)
    packed_values, unpacked_values = by_token[packed.rows], by_token[unpacked.rows]
    assert packed_values.keys() == unpacked_values.keys()
    for key, value in packed_values.items():
        assert value == pytest.approx(unpacked_values[key], abs=1e-5)


def test_rows_round_up_to_a_power_of_two_per_device(sequences):
    prompts, completions, behaviour, advantages = sequences
    batch = pack_sequences(
        prompts,
        completions,
        behaviour,
        advantages,
        row_tokens=16,
        rows_multiple=2,
        agree_rows=lambda rows: max(rows, 12),
    )
    assert batch.rows == 16  # 12 agreed rows over 2 devices: 6 per device, rounded to 8
    slots, total = batch.loss_index.shape[0], sum(len(c) for c in completions)
    assert slots >= total and slots & (slots - 1) == 0 and slots < 2 * total


def test_a_sequence_longer_than_a_row_is_refused(sequences):
    with pytest.raises(ValueError, match="does not fit"):
        pack(sequences, row_tokens=12)


def test_the_step_takes_a_pytree_of_arrays_and_another_sequence_count_reuses_its_program(
    sequences, model
):
    """`TrainBatch` leaves are all placed arrays (no static metadata: the sequence count travels
    as the traced normalizer), so a batch of the same shapes with fewer sequences does not
    recompile the step."""
    trainer = Trainer(
        model,
        AlgoConfig(learning_rate=1e-3),
        TrainerConfig(logit_chunk_tokens=16),
        mesh=Mesh(np.array(jax.devices()), ("fsdp",)),
        temperature=TEMPERATURE,
        max_new_tokens=8,
    )
    prompts, completions, behaviour, advantages = sequences
    shapes = dict(row_tokens=32, agree_rows=lambda rows: 8, loss_slots=128)
    full = pack_sequences(prompts, completions, behaviour, advantages, **shapes)
    fewer = pack_sequences(prompts[1:], completions[1:], behaviour[1:], advantages[1:], **shapes)
    placed = trainer.device_batch(full)
    assert isinstance(placed, TrainBatch) and placed.ref_logprobs is None
    leaves = jax.tree.leaves(placed)
    assert len(leaves) == 9 and all(isinstance(x, jax.Array) for x in leaves)
    shardings = jax.tree.leaves(trainer.batch_shardings)
    assert [x.sharding for x in leaves] == shardings
    assert float(trainer.device_batch(fewer).normalizer) == (N - 1) * 8
    for batch in (full, fewer):
        assert np.isfinite(trainer.train_step(batch)["train/loss"])
    assert trainer._step._cache_size() == 1
