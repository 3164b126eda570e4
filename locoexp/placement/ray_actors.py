"""The two kinds of host under `placement=da`, as plain classes that the driver wraps in
`ray.remote` (one actor process per host).

- `RolloutHost`: its own engine over its own devices; for step t it loads the newest published
  weights (dL), admits its whole groups of batch t, generates, scores, and returns the sequences
  with their behaviour log-probs and the weight version that produced them. It never joins the
  trainer's `jax.distributed` group.
- `TrainerHost`: one process of the trainer's own `jax.distributed` group (gloo on CPU); all of
  them fetch the rollout data of step t from Ray's object store, pack their share, train one
  FSDP step, all-gather the new weights, and the leader puts one host copy into the object store
  under the next version number (publication, dpub).

Actors are started with `XLA_FLAGS` in their environment, so jax sees `devices_per_host` CPU
devices. Timings are `timing/*` keys of a `StepTimer`, as under `co`. This module never reads the
root config and never decides the schedule: the driver (`disaggregated.py`) does.
"""

import time

import jax
import numpy as np
import ray
from flax import nnx
from jax.sharding import Mesh

from locoexp.algo.config import AlgoConfig
from locoexp.dataset.build import build_task
from locoexp.dataset.config import DatasetConfig
from locoexp.dataset.schedule import PromptSchedule
from locoexp.metrics.timing import StepTimer
from locoexp.model.checkpoint import load_model
from locoexp.model.config import ModelConfig
from locoexp.placement import phases
from locoexp.placement.launch import free_port, host_port, initialize_distributed
from locoexp.placement.multihost import HostGroup, replicate
from locoexp.placement.phases import StepSettings
from locoexp.rollout.build import build_engine
from locoexp.rollout.config import RolloutConfig
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.packing import pack_sequences
from locoexp.trainer.trainer import Trainer


def _window(start: float) -> dict[str, float]:
    """Wall-clock interval of a side's work (time.time(), comparable across local actors)."""
    return {"start": start, "end": time.time()}


class RolloutHost:
    """Rollout host `index` of `hosts`: engine, task and schedule of its own."""

    def __init__(
        self,
        *,
        index: int,
        hosts: int,
        model: ModelConfig,
        rollout: RolloutConfig,
        dataset: DatasetConfig,
        schedule: PromptSchedule,
        settings: StepSettings,
    ):
        self.index, self.hosts, self.settings, self.schedule = index, hosts, settings, schedule
        self.task = build_task(dataset, tokenizer_dir=model.checkpoint)
        policy = load_model(model, seed=settings.seed)
        self.engine = build_engine(
            policy,
            rollout,
            eos_id=self.task.tokenizer.eos_id,
            pad_id=self.task.tokenizer.pad_id,
            devices=jax.local_devices(),
            max_sequence_tokens=dataset.max_prompt_tokens + dataset.max_new_tokens,
        )
        # the tree that published pure dicts are loaded into: shapes only, so that the initial
        # weights live once (in the engine), not twice
        self.template = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), nnx.split(policy, nnx.Param)[1]
        )
        del policy
        self.version = 0  # the initial weights, identical to the trainer's (same seed)
        self.timer = StepTimer()

    def load(self, published: list) -> None:
        """Fetch and load `published` = [version, ObjectRef] if it is newer than ours (dL)."""
        if not published or published[0] == self.version:
            return
        version, ref = published
        nnx.replace_by_pure_dict(self.template, ray.get(ref))
        self.engine.load_weights(self.template)
        jax.block_until_ready(self.engine.params)
        self.version = version

    def generate(self, step: int, published: list) -> tuple[dict, dict]:
        """Batch `step`'s share of this host -> (metrics, data); data goes to the trainer."""
        timer, start = self.timer, time.time()
        with timer.step():
            with timer.phase("load"):
                self.load(published)
            part = phases.run_rollout(
                self.task,
                self.schedule,
                self.engine,
                step,
                host=self.index,
                hosts=self.hosts,
                settings=self.settings,
                timer=timer,
            )
        admitted, rollout, scored = part.admitted, part.rollout, part.scored
        times = timer.metrics()
        n = len(admitted.requests)
        data = {
            "step": step,
            "host": self.index,
            "version": self.version,
            "example_ids": [e.id for e in admitted.examples],
            "prompts": list(admitted.requests),
            "completions": [rollout.completion(i) for i in range(n)],
            "logprobs": [rollout.logprobs[i, : rollout.lengths[i]] for i in range(n)],
            "advantages": scored.advantages.reshape(-1).astype(np.float32),
        }
        metrics = {
            **part.metrics(),
            "rollout/weight_version": self.version,
            **{k: v for k, v in times.items() if k != "timing/unaccounted_s"},
        }
        metrics["timing/rollout_s"] = metrics.pop("timing/step_s")
        return {"host": metrics, "window": _window(start)}, data

    def evaluate(self, published: list, *, limit: int | None, updates: int) -> tuple[int, int]:
        """Held-out accuracy of the published weights on this host's share of the examples."""
        self.load(published)
        examples = self.task.eval[:limit] if limit else self.task.eval
        key = jax.random.fold_in(jax.random.key(self.settings.seed + 1), updates)
        return phases.evaluate(
            self.task,
            self.engine,
            examples[self.index :: self.hosts],
            key=jax.random.fold_in(key, self.index),
            max_new_tokens=self.settings.max_new_tokens,
            sampling=self.settings.eval_sampling,
        )


class TrainerHost:
    """Trainer host `index` of `hosts`; `join` forms the trainer's own jax.distributed group."""

    def __init__(self, *, index: int, hosts: int):
        self.index, self.hosts = index, hosts
        self.timer = StepTimer()

    def coordinator_address(self, bind_address: str | None) -> str:
        """Where the trainer group reaches its coordinator (called on host 0 only): this node's
        address, and a port free on the interface the coordinator will bind to."""
        node = ray.util.get_node_ip_address()
        return host_port(node, free_port(bind_address or node))

    def join(
        self,
        coordinator: str,
        *,
        bind_address: str | None,
        model: ModelConfig,
        algo: AlgoConfig,
        trainer: TrainerConfig,
        settings: StepSettings,
        temperature: float,
    ) -> int:
        """Join the group and build the trainer on all of its devices; returns the device count."""
        initialize_distributed(
            coordinator=coordinator if self.hosts > 1 else None,
            num_processes=self.hosts,
            process_id=self.index,
            bind_address=bind_address,
        )
        self.group = HostGroup.current()
        self.settings = settings
        self.trainer = Trainer(
            load_model(model, seed=settings.seed),
            algo,
            trainer,
            mesh=Mesh(np.array(jax.devices()), ("fsdp",)),
            temperature=temperature,
            max_new_tokens=settings.max_new_tokens,
        )
        return self.trainer.devices

    def train(self, step: int, rollouts: list) -> dict:
        """Step `step` on the rollouts (ObjectRefs, one per rollout host); returns metrics, the
        example ids trained and, on the leader, the published [version, ObjectRef]."""
        timer, start = self.timer, time.time()
        with timer.step():
            with timer.phase("transfer"):
                parts = ray.get(rollouts)
            steps = {p["step"] for p in parts}
            if steps != {step}:
                raise RuntimeError(f"trainer step {step} was handed rollouts of steps {steps}")
            with timer.phase("pack"):
                batch, staleness = self._pack(parts)
            with timer.phase("train"):
                metrics = self.trainer.train_step(batch)
            with timer.phase("publish"):
                published = self._publish()
        return {
            "host": {
                **metrics,
                "train/rows": batch.rows,
                "train/staleness_steps": staleness,
                **timer.metrics(),
            },
            "window": _window(start),
            "example_ids": [i for p in parts for i in p["example_ids"]],
            "published": published,
        }

    def _pack(self, parts: list[dict]):
        """This host's equal share of every rollout host's sequences -> a packed batch."""
        s, group = self.settings, self.group
        columns = {k: [x for p in parts for x in p[k]] for k in ("prompts", "completions")}
        logprobs = [x for p in parts for x in p["logprobs"]]
        advantages = np.concatenate([p["advantages"] for p in parts])
        n = len(advantages) // self.hosts  # the driver checked that hosts divide the sequences
        mine = slice(self.index * n, (self.index + 1) * n)
        slots = -(-(n * s.max_new_tokens) // s.loss_slot_multiple) * s.loss_slot_multiple
        batch = pack_sequences(
            columns["prompts"][mine],
            columns["completions"][mine],
            logprobs[mine],
            advantages[mine],
            row_tokens=s.row_tokens,
            rows_multiple=self.trainer.local_devices,
            agree_rows=lambda rows: int(group.allgather(np.array([rows])).max()),
            loss_slots=slots,
        )
        # the policy the loss starts from has `steps_done` updates; the sampler's had `version`
        staleness = max(self.trainer.steps_done - p["version"] for p in parts)
        return batch, staleness

    def _publish(self) -> list:
        """All-gather the new weights (every trainer host), one host copy into the object store
        (the leader): [version, ObjectRef], version = updates applied; [] off the leader."""
        full = replicate(self.trainer.params, self.trainer.mesh)
        if not self.group.is_leader:
            jax.block_until_ready(full)
            return []
        local = jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data), full)
        return [self.trainer.steps_done, ray.put(nnx.to_pure_dict(local))]
