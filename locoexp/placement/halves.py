"""The two halves of a step and the frozen, typed values they exchange (every placement).

- `RolloutHalf` (Algorithm 1, lines 1-3): load the newest published weights where they travel
  (`da`), admit this host's groups of batch t, generate, score -> a `RolloutBatch`.
- `TrainerHalf` (lines 4-6): pack this host's share of the batches, agree on rows with the other
  trainer hosts (the exchange that O1's metrics ride on), train, publish -> a `TrainResult` whose
  `Published` names the weight version (= updates applied).

A half times its phases on the `StepTimer` it is given and never opens the step: the loop does
in-process, a Ray actor does under `da`. Halves never import Ray, never read a config and never
decide when they run (`loop.py` does); how weights are published and loaded is injected.
"""

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from locoexp.checkpoint.export import export_trainer_policy
from locoexp.checkpoint.progress import RunProgress
from locoexp.checkpoint.state import RunCheckpoints
from locoexp.dataset.schedule import PromptSchedule
from locoexp.dataset.task import Task
from locoexp.metrics.timing import StepTimer
from locoexp.model.config import ModelConfig
from locoexp.placement import phases
from locoexp.placement.admission import AdmissionLog
from locoexp.placement.multihost import HostGroup, exchange_rows
from locoexp.placement.settings import StepSettings
from locoexp.rollout.engine import Rollout
from locoexp.rollout.protocol import Engine
from locoexp.rollout.requests import RequestQueue
from locoexp.rollout.straggler import injected_delay_s
from locoexp.tokenizer.protocol import Tokenizer
from locoexp.trainer.packing import PackedBatch, count_rows, pack_sequences
from locoexp.trainer.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class Window:
    """Wall-clock interval of a half's work (time.time(), comparable across local processes)."""

    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class Published:
    """Weights after `version` updates. `weights` is None where they already sit in this
    process's engine (in-process publication); under `da` it is the object-store reference."""

    version: int
    weights: Any = None


@dataclasses.dataclass(frozen=True)
class HalfReport:
    """What a half tells the loop: this host's metrics and when it worked."""

    metrics: dict[str, float]
    window: Window


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutBatch:
    """One rollout host's share of batch `step`: N = B x G sequences, groups contiguous."""

    step: int
    weight_version: int  # updates in the weights that sampled it
    example_ids: tuple[int, ...]  # [B]
    prompts: tuple[np.ndarray, ...]  # [N] token ids
    completions: tuple[np.ndarray, ...]  # [N] token ids
    behaviour_logprobs: tuple[np.ndarray, ...]  # [N] the sampler's log-prob of each token
    advantages: np.ndarray  # [N] float32
    report: HalfReport


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainResult:
    step: int
    published: Published | None  # None on a trainer host that does not publish (da, not leader)
    example_ids: tuple[int, ...]  # the prompts of every batch this step consumed
    versions: tuple[int, ...]  # the weight version of each of those batches
    # when each of those batches was generated (its rollout host's load to reward)
    windows: tuple[Window, ...]
    # O1: every host's record of the previous step, brought back by this step's row exchange
    exchanged: list[dict[str, Any]] | None
    report: HalfReport


@dataclasses.dataclass(kw_only=True)
class RolloutHalf:
    task: Task
    schedule: PromptSchedule
    engine: Engine
    settings: StepSettings
    host: int  # this rollout host among `hosts`
    hosts: int
    timer: StepTimer
    # dL: (engine, published) -> weights loaded; None where publication writes into `engine`
    load: Callable[[Engine, Published], None] | None = None
    version: int = 0  # the initial weights are the trainer's (same seed)
    admission_log: AdmissionLog | None = None  # this host's per-step admission records
    # called once each admission's first request is submitted (`admission.admit_requests`)
    on_first_request: Callable[[], None] | None = None

    def run(self, step: int, published: Published) -> RolloutBatch:
        """Batch `step`'s share of this host, sampled with `published`: load (where weights
        travel), admission, generation, reward, each a timed phase."""
        s, timer, start = self.settings, self.timer, time.time()
        if self.load is not None:
            with timer.phase("load"):
                self._load_newer(published)
        self.version = published.version
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(s.seed), step), self.host)
        queue = RequestQueue()
        with timer.phase("admission"):
            admitted = phases.admit(
                self.task,
                self.schedule,
                step,
                host=self.host,
                hosts=self.hosts,
                group_size=s.group_size,
                balance=s.opt.balance_prompts,
                queue=queue,
                pretokenized=s.opt.pretokenize_prompts,
                on_first_request=self.on_first_request,
            )
        head_interval_s = timer.elapsed_s()  # Figure 5: step start to generation start
        with timer.phase("generation"):
            rollout, injected = self._generate(step, queue, key)
        if self.admission_log is not None:
            self.admission_log.write(step, admitted.record)
        with timer.phase("reward"):
            scored = phases.score(
                self.task, admitted, rollout, advantage=s.advantage, eps=s.advantage_eps
            )
        n = len(admitted.requests)
        metrics = {
            **phases.rollout_metrics(admitted, rollout, scored),
            **admitted.record.metrics(),
            "timing/head_interval_s": head_interval_s,
            **decode_metrics(rollout),
            "rollout/weight_version": self.version,
            "rollout/injected_delay_s_max": injected,  # rollout.straggler: the slowed host's
            # this host's share of the step, load to reward: the straggler is the slowest (loop)
            "timing/rollout_host_s": time.time() - start,
        }
        return RolloutBatch(
            step=step,
            weight_version=self.version,
            example_ids=tuple(e.id for e in admitted.examples),
            prompts=tuple(admitted.requests),
            completions=tuple(rollout.completion(i) for i in range(n)),
            behaviour_logprobs=tuple(rollout.logprobs[i, : rollout.lengths[i]] for i in range(n)),
            advantages=scored.advantages.reshape(-1).astype(np.float32),
            report=HalfReport(metrics, Window(start, time.time())),
        )

    def _generate(self, step: int, queue: RequestQueue, key: jax.Array) -> tuple[Rollout, float]:
        """The step's rollout, and the delay rollout.straggler injected into it (seconds)."""
        s, generation_start = self.settings, time.perf_counter()
        rollout = phases.generate(
            self.engine, queue, key=key, max_new_tokens=s.max_new_tokens, sampling=s.sampling
        )
        injected = injected_delay_s(
            s.straggler,
            step=step,
            host=self.host,
            hosts=self.hosts,
            seed=s.seed,
            generation_s=time.perf_counter() - generation_start,
        )
        return rollout, injected

    def _load_newer(self, published: Published) -> None:
        if self.load is not None and published.version != self.version:
            self.load(self.engine, published)
            self.version = published.version

    def evaluate(self, published: Published, *, limit: int | None) -> tuple[int, int]:
        """(correct, scored) of this host's share of the held-out examples under `published`,
        one sample each at the evaluation temperature."""
        if self.load is not None:
            self._load_newer(published)
        mine = (self.task.eval[:limit] if limit else self.task.eval)[self.host :: self.hosts]
        if not mine:
            return 0, 0
        key = jax.random.fold_in(jax.random.key(self.settings.seed + 1), published.version)
        rollout = self.engine.generate(
            [e.prompt_tokens for e in mine],
            key=jax.random.fold_in(key, self.host),
            max_new_tokens=self.settings.max_new_tokens,
            sampling=self.settings.eval_sampling,
        )
        rewards = self.task.score(list(mine), [rollout.completion(n) for n in range(len(mine))])
        return int(self.task.is_correct(rewards).sum()), len(mine)


@dataclasses.dataclass(kw_only=True)
class TrainerHalf:
    trainer: Trainer
    settings: StepSettings
    group: HostGroup  # the trainer hosts (every host under co)
    timer: StepTimer
    publish: Callable[[Trainer], Published | None]
    # this host's share of the sequences handed to it: (0, 1) when it is handed its own
    # rollout host's batch (co), (index, trainer hosts) when handed every batch (da)
    share: tuple[int, int] = (0, 1)
    # colocated engine only: frees its weights before the train phase (the publication after it
    # loads new ones); None keeps them (rollout.release_weights_during_training)
    release: Callable[[], None] | None = None

    def train(
        self, step: int, batches: Sequence[RolloutBatch], *, carried: dict[str, Any] | None = None
    ) -> TrainResult:
        """One update on this host's share of `batches` (all of batch `step`); `carried` is the
        previous step's record that O1 sends along with the row exchange."""
        start = time.time()
        steps = {b.step for b in batches}
        if steps != {step}:
            raise RuntimeError(f"trainer step {step} was handed rollouts of steps {steps}")
        # the policy the loss starts from has `steps_done` updates; the sampler's had `version`
        staleness = self.trainer.steps_done - min(b.weight_version for b in batches)
        with self.timer.phase("pack"):
            packed, exchanged = self.pack(batches, carried=carried)
        with self.timer.phase("train"):
            if self.release is not None:
                self.release()
            metrics = self.trainer.train_step(packed)
        with self.timer.phase("publish"):
            published = self.publish(self.trainer)
        metrics = {**metrics, "train/rows": packed.rows, "train/staleness_steps": staleness}
        return TrainResult(
            step=step,
            published=published,
            example_ids=tuple(i for b in batches for i in b.example_ids),
            versions=tuple(b.weight_version for b in batches),
            windows=tuple(b.report.window for b in batches),
            exchanged=exchanged,
            report=HalfReport(metrics, Window(start, time.time())),
        )

    def save(self, checkpoints: RunCheckpoints, progress: RunProgress, *, wait: bool) -> None:
        """This host's shards of the training state; process 0 writes `progress`."""
        checkpoints.save(progress, self.trainer.state(), wait=wait)

    def restore(self, checkpoints: RunCheckpoints, step: int) -> Published | None:
        """Continue from the checkpoint after `step` updates and publish the restored weights
        (what the next batch samples with)."""
        _, state = checkpoints.restore(step, self.trainer.state())
        self.trainer.load_state(state, steps_done=step)
        return self.publish(self.trainer)

    def export(self, directory: str | Path, *, model: ModelConfig, tokenizer: Tokenizer) -> None:
        """The policy as a Hugging Face directory (every trainer host calls; process 0 writes)."""
        export_trainer_policy(self.trainer, model, tokenizer, directory)

    def pack(
        self, batches: Sequence[RolloutBatch], *, carried: dict[str, Any] | None
    ) -> tuple[PackedBatch, list[dict[str, Any]] | None]:
        """This host's share of `batches` in rows agreed with the other trainer hosts (the
        exchange `carried` rides on); returns the rows and what the exchange brought back."""
        s, (index, count) = self.settings, self.share
        prompts = [x for b in batches for x in b.prompts]
        completions = [x for b in batches for x in b.completions]
        n = len(prompts) // count  # main checked that the trainer hosts divide the sequences
        mine = slice(index * n, (index + 1) * n)
        lengths = np.array(
            [len(p) + len(c) for p, c in zip(prompts[mine], completions[mine], strict=True)]
        )
        rows, exchanged = exchange_rows(
            self.group, len(count_rows(lengths, s.row_tokens)), carried=carried
        )
        slots = -(-(n * s.max_new_tokens) // s.loss_slot_multiple) * s.loss_slot_multiple
        packed = pack_sequences(
            prompts[mine],
            completions[mine],
            [x for b in batches for x in b.behaviour_logprobs][mine],
            np.concatenate([b.advantages for b in batches])[mine],
            row_tokens=s.row_tokens,
            rows_multiple=self.trainer.local_devices,
            agree_rows=lambda _: rows,
            loss_slots=slots,
        )
        return packed, exchanged


def publish_to_engine(trainer: Trainer, *, engine: Engine, one_call: bool) -> Published:
    """In-process publication: the FSDP shards gathered into this host's engine (O4: one call)."""
    phases.publish(trainer.params, engine, mesh=trainer.mesh, one_call=one_call)
    return Published(trainer.steps_done)


def decode_metrics(rollout: Rollout) -> dict[str, float]:
    """Figure 7b's per-iteration decode time: the engine's decode iterations only (prefill and
    compiles excluded); none where the engine interleaves prefill and decode (vLLM)."""
    per_iteration = rollout.decode_s_per_iteration
    return {} if per_iteration is None else {"rollout/decode_ms_per_iteration": 1e3 * per_iteration}
