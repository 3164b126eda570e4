"""Run in a subprocess by tests/test_trainer_fsdp.py, with 4 CPU devices set before jax starts:
the loss, metrics and gradients of one batch from a one-device trainer in one shot (the
reference) and from 4-device FSDP trainers in one shot and in micro-batches of 1 and 2 rows per
device (each micro-batch's loss slots spread over the 4 devices' lanes, `trainer/micro.py`).
Writes them to an .npz file (argument 1)."""

import dataclasses
import os
import re
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as PS  # noqa: E402
from test_attention import packed_inputs  # noqa: E402
from test_planner_xla import (  # noqa: E402
    SHAPES,
    compiled_train_step,
    footprint,
    fsdp_trainer,
    placeholder_batch,
)
from tiny_policy import random_prompts, tiny_model  # noqa: E402

from locoexp.algo.config import AlgoConfig  # noqa: E402
from locoexp.model.attention import (  # noqa: E402
    AttentionSpec,
    dense_attention,
    on_own_rows,
    splash_attention,
)
from locoexp.model.config import DType, ModelConfig  # noqa: E402
from locoexp.trainer.config import AttentionKind, TrainerConfig  # noqa: E402
from locoexp.trainer.packing import pack_sequences  # noqa: E402
from locoexp.trainer.trainer import Trainer  # noqa: E402

MAX_NEW = 12
CPU_ATTENTION = (AttentionKind.dense, AttentionKind.blockwise)  # splash is TPU-only
ROW_SHAPE = (40, 48)  # rows x tokens of the activation check: no weight of the model is 40 wide
LAYOUTS = {  # name: (devices, micro_batch_rows)
    "one_device": (1, 0),
    "fsdp4": (4, 0),
    "fsdp4_micro1": (4, 1),
    "fsdp4_micro2": (4, 2),
}


def batch():
    """30 sequences of 5-23 tokens in rows of 32, 16 rows: four per device, some devices'
    rows holding more loss slots than others."""
    rng = np.random.default_rng(3)
    prompts = random_prompts(rng.integers(3, 12, size=30).tolist(), seed=1)
    completions = random_prompts(rng.integers(2, MAX_NEW + 1, size=30).tolist(), seed=2)
    behaviour = [rng.normal(-2.0, 0.3, size=len(c)).astype(np.float32) for c in completions]
    advantages = rng.normal(size=30).astype(np.float32)
    return pack_sequences(
        prompts, completions, behaviour, advantages, row_tokens=32, rows_multiple=4
    )


def row_activation_gathers(kind: AttentionKind) -> list[str]:
    """The all-gathers of the 4-device step of the embedded task's model (conf/model/tiny.yaml:
    vocabulary 16 < hidden 64, so FSDP shards its embedding on the hidden axis) whose output
    has a row dimension: [40, ...] rows or [1920, ...] tokens. FSDP gathers weights and loss
    slots; a gathered row activation is XLA replicating what the partitioner laid out wrongly."""
    rows, tokens = ROW_SHAPE
    config = TrainerConfig(attention=kind, attention_block_tokens=16)
    compiled = compiled_train_step(ModelConfig(), config, rows, tokens, 1024, devices=4)
    shapes = re.findall(r"= \w+\[([\d,]*)\][^=]*? all-gather\(", compiled.as_text())
    assert shapes, "no all-gather: the step is not FSDP-sharded"
    return [s for s in shapes if {rows, rows * tokens} & {int(d) for d in s.split(",") if d}]


def splash_on_rows(mesh: Mesh) -> dict[str, np.ndarray]:
    """Splash under the trainer's row layout on 4 devices: (1) the Pallas interpreter's kernel,
    run by each device on its rows (`on_own_rows`), against dense attention in values and
    gradients, and the all-gathers of that program; (2) the whole train step with the TPU
    (Mosaic) kernel, exported for TPU (`splash_step_for_tpu`): XLA cannot partition a Mosaic
    call, so without the per-device call the export fails ("Mosaic kernels cannot be
    automatically partitioned")."""
    rows = NamedSharding(mesh, PS("fsdp"))
    inputs = [
        jax.device_put(a, rows)
        for a in packed_inputs(4, 128, [[50, 50], [128], [7, 90], [3]], seed=2, head_dim=64)
    ]
    spec = AttentionSpec(kind=AttentionKind.splash, rows=rows)
    interpreted = on_own_rows(spec, lambda *a: splash_attention(*a, interpret=True))

    def out_and_grads(kernel, q, k, v, seg, weights):
        loss = lambda q, k, v: (kernel(q, k, v, seg) * weights).sum()
        return kernel(q, k, v, seg), *jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    compiled = jax.jit(out_and_grads, static_argnums=0).lower(interpreted, *inputs).compile()
    want = out_and_grads(dense_attention, *inputs)
    real = np.asarray(inputs[3] > 0)[:, :, None, None]
    diffs = [
        np.abs(np.where(real, a, 0) - np.where(real, b, 0)).max() if i == 0 else np.abs(a - b).max()
        for i, (a, b) in enumerate(zip(compiled(*inputs), want, strict=True))
    ]
    text = compiled.as_text()
    out = {"splash_rows/max_diff": np.asarray(max(diffs))}
    out["splash_rows/all_gathers"] = np.asarray(text.count(" all-gather("))
    try:
        out["splash_rows/tpu_kernels"] = np.asarray(splash_step_for_tpu())
    except NotImplementedError as error:
        out["splash_rows/tpu_error"] = np.asarray(str(error))
    return out


def splash_step_for_tpu() -> int:
    """The 4-device FSDP train step with `trainer.attention=splash` exported for TPU: its TPU
    (Mosaic) kernel count. The CPU backend refuses splash when the trainer is built, so the
    trainer is built blockwise and its kernel switched before the step is traced."""
    model = ModelConfig(
        vocab_size=512, hidden_dim=256, mlp_dim=512, num_heads=4, num_kv_heads=2,
        head_dim=128, param_dtype=DType.bfloat16,
    )  # fmt: skip
    trainer = fsdp_trainer(model, TrainerConfig(attention=AttentionKind.blockwise), 256, 4)
    trainer.attention = dataclasses.replace(trainer.attention, kind=AttentionKind.splash)
    batch = placeholder_batch(8, 512, 256)
    args = (trainer.trainable, trainer.opt_state, trainer.frozen, trainer.device_batch(batch))
    shapes = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), args
    )
    exported = jax.export.export(trainer._step, platforms=["tpu"])(*shapes, trainer.reference)
    return exported.mlir_module().count("tpu_custom_call")


def main(path: str) -> None:
    assert jax.device_count() == 4
    data, out = batch(), {}
    assert data.rows == 16, data.rows
    for name, (devices, micro) in LAYOUTS.items():
        trainer = Trainer(
            tiny_model(seed=0),
            AlgoConfig(learning_rate=1e-2, kl_coef=0.1),
            TrainerConfig(logit_chunk_tokens=8, micro_batch_rows=micro),
            mesh=Mesh(np.array(jax.devices()[:devices]), ("fsdp",)),
            temperature=0.7,
            max_new_tokens=MAX_NEW,
        )
        (loss, metrics), grads = trainer.loss_and_grads(data)
        out[f"{name}/loss"] = np.asarray(loss)
        for key, value in metrics.items():
            out[f"{name}/{key}"] = np.asarray(value)
        flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(jax.device_get(grads)))[0]
        for key_path, value in flat:
            out[f"{name}/grad/{jax.tree_util.keystr(key_path)}"] = np.asarray(value)
    model, (rows, row_tokens, slots), _ = SHAPES["qwen-vocab-f32"]
    config = TrainerConfig(
        attention=AttentionKind.blockwise, attention_block_tokens=128, micro_batch_rows=1
    )
    compiled = compiled_train_step(model, config, 4 * rows, row_tokens, 4 * slots, devices=4)
    out["xla4/micro1"] = np.asarray(footprint(compiled))
    for kind in CPU_ATTENTION:
        out[f"row_gathers/{kind.value}"] = np.asarray(row_activation_gathers(kind))
    out.update(splash_on_rows(Mesh(np.array(jax.devices()), ("fsdp",))))
    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1])
