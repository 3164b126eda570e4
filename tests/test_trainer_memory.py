"""The trainer's memory knobs change what is stored, not what is computed: every attention
kernel, remat policy and micro-batch size gives the plain step's loss, metrics and gradients
(GRPO's token mean and Dr. GRPO's constant normaliser, with and without a KL reference), and a
micro-batched step still makes one optimizer update.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh
from tiny_policy import random_prompts, tiny_model

from locoexp.algo.config import AlgoConfig, LossAggregation
from locoexp.model.config import AttentionKind, RematPolicy
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.micro import MicroLayout, group_slots
from locoexp.trainer.packing import pack_sequences
from locoexp.trainer.trainer import Trainer

MAX_NEW = 12
PLAIN = TrainerConfig(logit_chunk_tokens=16, attention=AttentionKind.dense)


def build(config: TrainerConfig, *, algo: AlgoConfig) -> Trainer:
    return Trainer(
        tiny_model(seed=0),
        algo,
        config,
        mesh=Mesh(np.array(jax.devices()), ("fsdp",)),
        temperature=0.7,
        max_new_tokens=MAX_NEW,
    )


def batch():
    """14 sequences of 5-23 tokens in rows of 32: 8 rows (7 used), several sequences per row."""
    rng = np.random.default_rng(0)
    prompts = random_prompts(rng.integers(3, 12, size=14).tolist(), seed=1)
    completions = random_prompts(rng.integers(2, MAX_NEW + 1, size=14).tolist(), seed=2)
    behaviour = [rng.normal(-2.0, 0.3, size=len(c)).astype(np.float32) for c in completions]
    advantages = rng.normal(size=14).astype(np.float32)
    return pack_sequences(prompts, completions, behaviour, advantages, row_tokens=32)


def loss_and_grads(config: TrainerConfig, algo: AlgoConfig):
    (loss, metrics), grads = build(config, algo=algo).loss_and_grads(batch())
    return float(loss), jax.device_get(metrics), nnx.to_pure_dict(jax.device_get(grads))


_PLAIN_RESULTS = {}


def assert_same_step(config: TrainerConfig, algo: AlgoConfig):
    if id(algo) not in _PLAIN_RESULTS:  # the reference step, once per algo setting
        _PLAIN_RESULTS[id(algo)] = loss_and_grads(PLAIN, algo)
    want_loss, want_metrics, want_grads = _PLAIN_RESULTS[id(algo)]
    loss, metrics, grads = loss_and_grads(config, algo)
    assert loss == pytest.approx(want_loss, abs=1e-6)
    for key, value in want_metrics.items():
        assert float(metrics[key]) == pytest.approx(float(value), abs=1e-5), key
    scale = max(np.abs(g).max() for g in jax.tree.leaves(want_grads))
    assert scale > 1e-3  # the comparison below is not between zeros
    jax.tree.map(
        lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5 * scale, rtol=0), grads, want_grads
    )


GRPO = AlgoConfig(learning_rate=1e-2)
DR_GRPO = AlgoConfig(learning_rate=1e-2, loss_aggregation=LossAggregation.constant)
WITH_KL = AlgoConfig(learning_rate=1e-2, kl_coef=0.1)


@pytest.mark.parametrize("block", [8, 512])
def test_blockwise_attention_gives_the_plain_step(block):
    config = TrainerConfig(logit_chunk_tokens=16, attention_block_tokens=block)
    assert_same_step(config, GRPO)


@pytest.mark.parametrize("policy", [RematPolicy.block, RematPolicy.save_matmuls])
def test_remat_gives_the_plain_step(policy):
    assert_same_step(TrainerConfig(logit_chunk_tokens=16, remat=policy), GRPO)


def test_rematerialised_blocks_are_one_scan_and_differing_blocks_stay_unrolled():
    """XLA-TPU schedules unrolled checkpointed blocks' recomputations together (no memory
    saved); a scan recomputes one block per backward iteration (`transformer.scanned_blocks`).
    Gemma4's local and global layers differ in structure and keep the unrolled path."""
    from locoexp.compose import compose_config  # noqa: PLC0415
    from locoexp.model.attention import AttentionSpec  # noqa: PLC0415
    from locoexp.model.transformer import build_model  # noqa: PLC0415

    tokens = np.arange(16, dtype=np.int32).reshape(1, 16) % 50
    positions, segments = np.arange(16, dtype=np.int32)[None], np.ones((1, 16), np.int32)

    def scans(model, remat: RematPolicy) -> int:
        spec = AttentionSpec(kind=AttentionKind.dense)  # no loop of its own
        forward = lambda m: m.packed_hidden(
            tokens, positions, segments, attention=spec, remat=remat
        )  # noqa: E731
        return str(jax.make_jaxpr(lambda m: forward(m).sum())(model)).count(" scan[")

    qwen = tiny_model(seed=0)
    assert scans(qwen, RematPolicy.block) == 1 and scans(qwen, RematPolicy.none) == 0
    gemma = build_model(compose_config(["model=tiny_gemma4_moe"]).model, seed=0)
    assert scans(gemma, RematPolicy.block) == 0


@pytest.mark.parametrize(
    ("micro_rows", "algo"), [(1, GRPO), (2, DR_GRPO), (3, GRPO), (4, WITH_KL)]
)  # 3 does not divide the 8 rows: the last micro-batch is padded
def test_micro_batches_give_the_plain_step(micro_rows, algo):
    config = TrainerConfig(logit_chunk_tokens=16, micro_batch_rows=micro_rows)
    assert_same_step(config, algo)


def test_micro_batches_with_remat_and_dense_attention_give_the_plain_step():
    config = TrainerConfig(
        logit_chunk_tokens=16,
        attention=AttentionKind.dense,
        remat=RematPolicy.block,
        micro_batch_rows=2,
    )
    assert_same_step(config, DR_GRPO)


def test_a_micro_batched_step_is_one_update_equal_to_the_plain_one():
    """Same parameters after one step (one AdamW update, not one per micro-batch). A large
    adam_eps makes the first update proportional to the gradient (not its sign, which rounding
    flips where a gradient is ~0)."""
    algo = AlgoConfig(learning_rate=1e-2, adam_eps=1.0)
    plain, micro = build(PLAIN, algo=algo), build(TrainerConfig(micro_batch_rows=2), algo=algo)
    data = batch()
    assert plain.train_step(data)["train/loss"] == pytest.approx(
        micro.train_step(data)["train/loss"], abs=1e-6
    )
    assert micro.steps_done == 1
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-7),
        nnx.to_pure_dict(plain.params),
        nnx.to_pure_dict(micro.params),
    )


def test_micro_layout_keeps_each_device_share_and_round_trips():
    """4 devices x 6 rows in micro-batches of 4: each micro-batch takes rows of every device's
    share (so it stays sharded like the batch), padding the last; join undoes split."""
    layout = MicroLayout.of(24, devices=4, micro_batch_rows=4)
    assert (layout.rows_per_device, layout.micro_rows, layout.count) == (6, 4, 2)
    rows = np.arange(24 * 3).reshape(24, 3)
    split = np.asarray(layout.split(rows))
    assert split.shape == (2, 16, 3)
    np.testing.assert_array_equal(split[0, :4, 0], rows[:4, 0])  # device 0's first 4 rows
    np.testing.assert_array_equal(split[0, 4:8, 0], rows[6:10, 0])  # device 1's first 4 rows
    np.testing.assert_array_equal(split[1, :4, 0], [12, 15, 0, 0])  # device 0's last 2, padding
    np.testing.assert_array_equal(np.asarray(layout.join(split)), rows)
    assert MicroLayout.of(24, devices=4, micro_batch_rows=0).count == 1


@pytest.mark.slow
def test_each_micro_batch_lane_holds_its_devices_slots_in_row_order():
    """`group_slots` (sort-free) against a NumPy sort by (micro-batch, device, position) over
    random layouts with dropped slots: each lane holds exactly its device's slots of that
    micro-batch, in the order of their positions, then zeros; the chunk counts cover the
    fullest lane."""
    rng = np.random.default_rng(0)
    for _ in range(8):
        devices, rows, tokens = (int(rng.choice(c)) for c in ([1, 2, 4], [1, 2, 3, 4], [8, 40]))
        layout = MicroLayout.of(devices * rows, devices, int(rng.integers(1, rows + 1)))
        m, n = layout.micro_rows, layout.count
        k = int(rng.integers(1, devices * rows * tokens))
        flat = rng.choice(devices * rows * tokens, size=k, replace=False)
        mask = (rng.random(k) < 0.8).astype(np.float32)
        groups, chunks = group_slots(
            layout, tokens, jnp.asarray(flat, jnp.int32), {"mask": jnp.asarray(mask),
            "slot": jnp.arange(k, dtype=jnp.int32)}, chunk=8,
        )  # fmt: skip
        row, position = flat // tokens, flat % tokens
        device, within = row // rows, row % rows
        local = (within % m) * tokens + position
        for t in range(n):
            for d in range(devices):
                mine = np.flatnonzero((mask > 0) & (within // m == t) & (device == d))
                mine = mine[np.argsort(local[mine])]
                lane = np.asarray(groups["slot"][t, d])
                np.testing.assert_array_equal(lane[: len(mine)], mine)
                assert not lane[len(mine) :].any() and not groups["mask"][t, d, len(mine) :].any()
                np.testing.assert_array_equal(
                    np.asarray(groups["index"][t, d, : len(mine)]), d * m * tokens + local[mine]
                )
                assert int(chunks[t]) * 8 >= len(mine)
