"""The memory plan against XLA's own buffer assignment of the compiled programs, on this CPU.

The plan models XLA for TPU (what decides a run's fit is XLA's compile, `locoexp/compiled`);
XLA on CPU differs where it computes bfloat16 matmuls in float32 and folds remat back into the
forward pass, so the shapes here are the ones it compiles as a TPU would lay them out: float32
weights, no remat. For two shapes (a tiny vocabulary with dense attention; Qwen3's 151,936-token
vocabulary, where the fused head dominates, with blockwise attention) the plan's estimate of the
train step and of one generation wave (chunked prefill, then decode) must lie within +-25% of
what `jax.jit(f).lower(...).compile().memory_analysis()` reports: arguments + outputs - aliased
(donated) buffers + temporaries, i.e. the program's peak footprint on one CPU device. The plan
against XLA for TPU over the paper's cells: tools/compile_paper_cells.py (experiments/LOG.md).
"""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from locoexp.algo.config import AlgoConfig
from locoexp.model.config import ModelConfig
from locoexp.model.sizes import count_parameters_by_formula
from locoexp.model.transformer import build_model
from locoexp.planner.estimate import EngineShape, TrainerShape, estimate_engine, estimate_trainer
from locoexp.rollout.config import RolloutConfig, SamplingParams
from locoexp.rollout.engine import JaxEngine
from locoexp.trainer.config import AttentionKind, TrainerConfig
from locoexp.trainer.packing import PackedBatch
from locoexp.trainer.trainer import Trainer

TOLERANCE = 0.25
# The trainer's settings per shape: dense attention in one shot (the reference), and blockwise
# attention without remat.
TRAINERS = {
    "tiny-f32": TrainerConfig(attention=AttentionKind.dense),
    "qwen-vocab-f32": TrainerConfig(attention=AttentionKind.blockwise, attention_block_tokens=128),
}
SHAPES = {  # model, trainer (rows, row tokens, loss slots), engine (rows, prompt, new tokens)
    "tiny-f32": (ModelConfig(), (8, 256, 512), (16, 64, 64)),
    "qwen-vocab-f32": (
        ModelConfig(
            vocab_size=151_936,
            num_layers=2,
            hidden_dim=128,
            mlp_dim=384,
            num_heads=4,
            num_kv_heads=2,
            head_dim=32,
        ),
        (2, 256, 256),
        (8, 64, 64),
    ),
}


def footprint(compiled) -> int:
    m = compiled.memory_analysis()
    return (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
    )


def compiled_train_step(
    model_config: ModelConfig,
    config: TrainerConfig,
    rows: int,
    row_tokens: int,
    slots: int,
    devices: int = 1,
):
    """The train step compiled for `rows` x `row_tokens` packed rows and `slots` loss slots (all
    devices together) on an FSDP mesh of the first `devices` devices."""
    trainer = fsdp_trainer(model_config, config, slots, devices)
    return trainer.lower_step(placeholder_batch(rows, row_tokens, slots)).compile()


def fsdp_trainer(model_config: ModelConfig, config: TrainerConfig, slots: int, devices: int):
    """A trainer of a freshly initialised model on an FSDP mesh of the first `devices` devices."""
    return Trainer(
        build_model(model_config, seed=0),
        AlgoConfig(),
        config,
        mesh=Mesh(np.array(jax.devices()[:devices]), ("fsdp",)),
        temperature=1.0,
        max_new_tokens=slots,
    )


def placeholder_batch(rows: int, row_tokens: int, slots: int) -> PackedBatch:
    """A packed batch of these shapes (one sequence a row, every slot scored): what a compile
    reads of a batch is its shapes."""
    ints = np.ones((rows, row_tokens), np.int32)
    zeros = np.zeros(slots, np.float32)
    return PackedBatch(
        tokens=ints,
        positions=ints,
        segment_ids=ints,
        loss_index=np.arange(slots, dtype=np.int32),
        loss_targets=np.zeros(slots, np.int32),
        loss_mask=zeros + 1,
        advantages=zeros,
        behaviour_logprobs=zeros,
        num_sequences=rows,
    )


def compiled_wave(model_config: ModelConfig, rows: int, prompt: int, new: int, chunk: int):
    """The peak of one wave: the larger of the prefill and the decode program's footprints."""
    engine = JaxEngine(
        build_model(model_config, seed=0),
        RolloutConfig(prefill_chunk_tokens=chunk),
        eos_id=0,
        pad_id=0,
        devices=jax.devices()[:1],
    )
    start, run, requests = engine.wave_programs(
        [np.zeros(prompt, np.int32)] * rows,
        max_new_tokens=new,
        sampling=SamplingParams(temperature=1.0),
    )
    args = (engine.params, requests, jax.random.key(0))
    state = jax.eval_shape(start, *args)
    decode = run.lower(engine.params, state, requests).compile()
    return max(footprint(start.lower(*args).compile()), footprint(decode))


def trainer_shape(config: TrainerConfig, rows: int, row_tokens: int, slots: int) -> TrainerShape:
    """The plan's shape of one trainer device for `config`."""
    return TrainerShape(
        devices=1,
        rows=rows,
        row_tokens=row_tokens,
        micro_batch_rows=config.micro_batch_rows or rows,
        loss_slots=slots,
        logit_chunk=config.logit_chunk_tokens,
        attention=config.attention,
        attention_block=config.attention_block_tokens,
        remat=config.remat,
        kl_reference=False,
    )


@pytest.mark.parametrize("name", SHAPES)
def test_train_step_estimate_is_within_25_percent_of_xla(name):
    model, (rows, row_tokens, slots), _ = SHAPES[name]
    config = TRAINERS[name]
    shape = trainer_shape(config, rows, row_tokens, slots)
    planned = estimate_trainer(model, count_parameters_by_formula(model), shape).total
    measured = footprint(compiled_train_step(model, config, rows, row_tokens, slots))
    print(f"train step {name}: plan {planned} B, XLA {measured} B, ratio {planned / measured:.3f}")
    assert abs(planned / measured - 1) <= TOLERANCE, (planned, measured)


@pytest.mark.parametrize("name", SHAPES)
def test_generation_wave_estimate_is_within_25_percent_of_xla(name):
    model, _, (rows, prompt, new) = SHAPES[name]
    chunk = prompt // 2  # chunked prefill: two chunks per prompt
    shape = EngineShape(
        tensor_parallel=1,
        sequences_per_replica=rows,
        prompt_tokens=prompt,
        new_tokens=new,
        prefill_chunk=chunk,
        dtype=model.param_dtype,
    )
    planned = estimate_engine(model, shape).total
    measured = compiled_wave(model, rows, prompt, new, chunk)
    print(f"generate {name}: plan {planned} B, XLA {measured} B, ratio {planned / measured:.3f}")
    assert abs(planned / measured - 1) <= TOLERANCE, (planned, measured)
