"""Programs that tests run inside real local host processes (`launch_local_processes`).

Each function runs in every process of a `jax.distributed` group and writes what the test checks
to `out_dir` as .npz files (process p writes `<name>_<p>.npz`). They use the platform's own
objects (Trainer, JaxEngine, packing, publication), nothing mocked.
"""

from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from locoexp.algo.config import AlgoConfig
from locoexp.model.config import ModelConfig
from locoexp.model.transformer import build_model
from locoexp.placement import phases
from locoexp.placement.multihost import HostGroup, gather_for_engine
from locoexp.rollout.config import RolloutConfig, SamplingParams
from locoexp.rollout.engine import JaxEngine
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.packing import pack_sequences
from locoexp.trainer.trainer import Trainer

MODEL = ModelConfig(
    vocab_size=32, num_layers=2, hidden_dim=32, mlp_dim=64, num_heads=4, num_kv_heads=2, head_dim=8
)
SEQUENCES = 8
MAX_NEW = 6


def fixed_sequences(seed: int = 0):
    """The same prompts, completions, behaviour log-probs and advantages in every process."""
    rng = np.random.default_rng(seed)
    prompts = [
        rng.integers(3, 32, size=rng.integers(2, 7)).astype(np.int32) for _ in range(SEQUENCES)
    ]
    completions = [
        rng.integers(3, 32, size=rng.integers(1, MAX_NEW + 1)).astype(np.int32)
        for _ in range(SEQUENCES)
    ]
    behaviour = [rng.normal(-3.0, 0.1, size=len(c)).astype(np.float32) for c in completions]
    advantages = rng.normal(size=SEQUENCES).astype(np.float32)
    return prompts, completions, behaviour, advantages


def step_publish_sample(out_dir: str) -> None:
    """One FSDP step over all devices on every process's share of the fixed sequences, then
    publication to this host's engine and sampling. Writes the listening TCP ports
    (`ports_<p>`: process 0 hosts the coordinator service), the loss and the gathered
    parameters after the step (`train_<p>`), and the engine's log-probs of its samples beside
    the trainer's (`publish_<p>`). One launch serves the tests of all three."""
    import psutil  # noqa: PLC0415

    hosts, index = jax.process_count(), jax.process_index()
    listening = psutil.Process().net_connections(kind="tcp")
    ports = sorted({c.laddr.port for c in listening if c.status == psutil.CONN_LISTEN})
    np.savez(Path(out_dir) / f"ports_{index}.npz", ports=np.array(ports))

    prompts, completions, behaviour, advantages = fixed_sequences()
    model = build_model(MODEL, seed=0)
    trainer = Trainer(
        model,
        AlgoConfig(learning_rate=1e-2),
        TrainerConfig(),
        mesh=Mesh(np.array(jax.devices()), ("fsdp",)),
        temperature=1.0,
        max_new_tokens=MAX_NEW,
    )
    engine = JaxEngine(model, RolloutConfig(), eos_id=2, pad_id=0, devices=jax.local_devices())

    def pack(ps, cs, bs, adv):
        return pack_sequences(
            ps,
            cs,
            bs,
            adv,
            row_tokens=16,
            rows_multiple=len(jax.local_devices()),
            agree_rows=agree,
            loss_slots=len(ps) * MAX_NEW,
        )

    share = slice(index * SEQUENCES // hosts, (index + 1) * SEQUENCES // hosts)
    metrics = trainer.train_step(
        pack(prompts[share], completions[share], behaviour[share], advantages[share])
    )
    full = gather_for_engine(trainer.params, trainer.mesh, jax.local_devices(), one_call=True)
    leaves = {"/".join(map(str, path)): np.asarray(leaf) for path, leaf in _flat(full)}
    np.savez(Path(out_dir) / f"train_{index}.npz", loss=metrics["train/loss"], **leaves)

    phases.publish(trainer.params, engine, mesh=trainer.mesh, one_call=False)  # the per-layer path
    rollout = engine.generate(
        prompts,
        key=jax.random.key(index),
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(temperature=1.0),
    )
    sampled = [rollout.completion(n) for n in range(len(prompts))]
    engine_logp = [rollout.logprobs[n, : rollout.lengths[n]] for n in range(len(prompts))]
    batch = pack(prompts, sampled, engine_logp, advantages)
    np.savez(
        Path(out_dir) / f"publish_{index}.npz",
        engine=batch.behaviour_logprobs,
        trainer=trainer.logprobs(batch),
        mask=batch.loss_mask,
    )


def agree(rows: int) -> int:
    """The packed-shape agreement of the step engine: the largest row count of any host."""
    return int(HostGroup.current().allgather(np.array([rows]))[:, 0].max())


def _flat(state):
    return jax.tree_util.tree_flatten_with_path(state)[0]


def fail_on_host_one(out_dir: str) -> None:
    """Host 1 fails at once; host 0 would block on a collective forever without the launcher."""
    if jax.process_index() == 1:
        raise RuntimeError("injected failure on host 1")
    HostGroup.current().allgather(np.array([1.0]))
    (Path(out_dir) / "host0_finished").write_text("unexpected")
