"""Run in a subprocess by tests/test_moe_expert_parallel.py, with 4 CPU devices set before jax
starts: one MoE layer's routed output (`moe.expert_outputs`) and its gradients with respect to
the tokens, the routing weights and the expert stacks, on one device and as the trainer runs it
(`expert_mesh(mesh, <every axis>)`: tokens split over every device of an (fsdp[, expert]) mesh,
each routing its own, the stacks along `expert`) at FSDP4, EP2 and EP4; and the TPU weight
gradient's kernel (`moe.weight_gradient`, in Pallas' interpreter) on one device and split over a
2 x 2 mesh. Writes them to an .npz file (argument 1)."""

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as PS  # noqa: E402

from locoexp.model.moe import EXPERT, expert_mesh, expert_outputs, weight_gradient  # noqa: E402
from locoexp.trainer.trainer import trainer_mesh  # noqa: E402

E, D, WIDTH, N, K = 8, 16, 12, 32, 2  # experts, width, expert width, tokens, per token


def inputs():
    keys = jax.random.split(jax.random.key(0), 6)
    x = jax.random.normal(keys[0], (N, D))
    gate, up = (jax.random.normal(k, (E, D, WIDTH)) * 0.3 for k in keys[1:3])
    down = jax.random.normal(keys[3], (E, WIDTH, D)) * 0.3
    experts = jax.vmap(lambda k: jax.random.permutation(k, E)[:K])(jax.random.split(keys[4], N))
    weights = jax.nn.softmax(jax.random.normal(keys[5], (N, K)))
    return x, weights, gate, up, down, experts


def loss(x, weights, gate, up, down, experts):
    out = expert_outputs(x, experts, weights, gate, up, down)
    return jnp.sum(out * jnp.cos(jnp.arange(D))), out


def results(ep: int, one_device: bool = False) -> dict[str, np.ndarray]:
    x, weights, gate, up, down, experts = inputs()
    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))
    if one_device:
        (_, out), grads = grad(x, weights, gate, up, down, experts)
    else:
        mesh = trainer_mesh(jax.devices(), ep)
        tokens = NamedSharding(mesh, PS(tuple(mesh.axis_names)))
        stacks = NamedSharding(mesh, PS(EXPERT) if ep > 1 else PS())
        placed = [jax.device_put(v, tokens) for v in (x, weights)]
        placed += [jax.device_put(v, stacks) for v in (gate, up, down)]
        with expert_mesh(mesh, tuple(mesh.axis_names)):
            (_, out), grads = grad(*placed, jax.device_put(experts, tokens))
    names = ("x", "weights", "gate", "up", "down")
    return {"out": np.asarray(out)} | {
        f"grad_{n}": np.asarray(g) for n, g in zip(names, grads, strict=True)
    }


def kernel_results() -> dict[str, np.ndarray]:
    """300 rows (padded to 4 x 128 on the mesh), an empty group, 50 rows past the last."""
    keys = jax.random.split(jax.random.key(1), 2)
    rows, grad = jax.random.normal(keys[0], (300, D)), jax.random.normal(keys[1], (300, WIDTH))
    sizes = jnp.asarray([40, 0, 100, 60, 50], jnp.int32)
    one = weight_gradient(rows, grad, sizes, 5, interpret=True)
    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with jax.set_mesh(mesh):
        split = jax.jit(lambda r, g, s: weight_gradient(r, g, s, 5, interpret=True))(
            rows, grad, sizes
        )
    return {
        "kernel/one": np.asarray(one),
        "kernel/split": np.asarray(split),
    }


def main(path: str) -> None:
    out = {f"one/{k}": v for k, v in results(1, one_device=True).items()}
    out |= {f"ep{ep}/{k}": v for ep in (1, 2, 4) for k, v in results(ep).items()}
    np.savez(path, **out, **kernel_results())


if __name__ == "__main__":
    main(sys.argv[1])
