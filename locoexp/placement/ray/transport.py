"""The Ray transport (`placement=da`, LoCoJAX-DA, Sections 2 and 4.4): the loop runs in a Ray
driver and the halves in actors (`hosts.py`), with staleness s (`placement.max_staleness`,
the paper's 1).

Step t: start every batch through t+s not yet started with the newest published weights (those
after step t-1), wait for batch t (`timing/trainer_idle_s`), start training on it, wait for
training (`trainer_round_s`).
Batches travel as object-store references from rollout actors to trainer actors; the driver
fetches only their reports. Records have the `co` keys where they mean the same thing:
rollout-side timings (`load`, `admission`, `generation`, `reward`, `rollout`) are those of the
batch trained at that step, trainer-side ones (`transfer`, `pack`, `train`, `publish`,
`trainer`) of that step; `timing/step_s` is the driver's period. The driver checks that every
batch is trained exactly once with the scheduled prompts (`BatchLedger`, `batches.jsonl`).
Every actor and Ray itself stop when the run ends or fails, or when the driver dies
(`session.py`).

Runs that survive (issue 13):
- A rollout host whose process dies is restarted by Ray (`hosts.py`); the driver sees the
  actor's error where it waits for that host's report, waits for the restart and asks it again
  for the same step with the same `Published` the lost call had (with staleness 1, batch t+1's
  weights are those after step t-1, not the newest), so the regenerated batch is the lost one
  (same prompts, sampling key and weights). The ledger records the restart; past the host's
  budget the run ends with one sentence (`RunFailed`). Evaluation is redone the same way.
- A node lost whole (issue 31): its rollout hosts restart on another node with a free CPU
  (`hosts.host_places`) and are asked again as above; a restart that Ray cannot place within
  `placement.rollout_restart_timeout_s` ends the run with one sentence, never a wait without end.
- A trainer host that dies ends the run with one sentence (`RunFailed`) naming it; the driver
  does not wait for its peers, which may be blocked in a collective with it.
- Checkpoints: each trainer host saves and restores its shards; the driver adds the weight
  version, the ledger and every batch in flight (up to `placement.max_staleness`, each with the
  weight version that sampled it; `saved_batches.py`), which a resumed run trains instead of
  sampling them again with newer weights (so it continues exactly, at any staleness).
"""

import collections
import contextlib
import dataclasses
import functools
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import ray

from locoexp.checkpoint.progress import LedgerRow, RunProgress
from locoexp.checkpoint.state import RunCheckpoints
from locoexp.dataset.schedule import PromptSchedule
from locoexp.errors import ConfigError, RunFailed
from locoexp.layout import Layout
from locoexp.metrics.breakdown import StepProfiler
from locoexp.metrics.timing import StepTimer
from locoexp.model.config import ModelConfig
from locoexp.placement.coordinator import CoordinatorSpec
from locoexp.placement.halves import (
    HalfReport,
    Published,
    RolloutBatch,
    TrainResult,
)
from locoexp.placement.multihost import HostGroup
from locoexp.placement.ray.hosts import (
    Hosts,
    build_actor_rollout_half,
    build_actor_trainer_half,
    start_hosts,
)
from locoexp.placement.ray.ledger import BatchLedger
from locoexp.placement.ray.saved_batches import (
    clear_batches,
    load_batches,
    prune_batches,
    save_batches,
)
from locoexp.placement.ray.session import ray_session
from locoexp.placement.ray.spec import RaySpec
from locoexp.placement.ray.terms import ScheduleTerms
from locoexp.placement.settings import HalvesSpec
from locoexp.tokenizer.protocol import Tokenizer

# A host is lost when its actor died, or when Ray's memory monitor killed its worker while it
# ran a call: Ray raises OutOfMemoryError for that call, which is not a RayActorError.
HOST_LOST = (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError)


Refs = tuple[ray.ObjectRef, ray.ObjectRef]  # a rollout host's (report, batch) in flight


@dataclasses.dataclass(kw_only=True)
class PendingRollout:
    """Batch `step` in flight, sampled with `published`: per rollout host, (report, batch) refs.
    A restarted host's pair is replaced by the regenerated one."""

    step: int
    published: Published
    calls: list[Refs]
    # each host's restarts (this attempt) when its call was made: a call made before a restart
    # that another call already reported is redone without counting that restart again
    incarnations: list[int]


@dataclasses.dataclass(kw_only=True)
class RayActors:
    hosts: Hosts
    ledger: BatchLedger
    run_dir: Path
    rollout_restarts: int  # placement.rollout_restarts: each rollout host's restart budget
    restart_timeout_s: float  # placement.rollout_restart_timeout_s: the wait for one restart
    # a resumed run's saved batches in flight, by step: trained without sampling them again
    restored: dict[int, list[RolloutBatch]] = dataclasses.field(default_factory=dict)
    # batches started and not yet trained, by step (what a checkpoint saves)
    in_flight: dict[int, PendingRollout] = dataclasses.field(default_factory=dict)
    # restarts per rollout host in this attempt (Ray's budget is per actor; the ledger's rows
    # also hold an earlier attempt's)
    restarted: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # the windows Eq. 4's A and the overlap are measured from, until each step's record is out
    terms: ScheduleTerms = dataclasses.field(default_factory=ScheduleTerms)

    @property
    def profiler(self) -> StepProfiler:
        """The driver traces nothing: it has no devices, and each actor traces its own side."""
        return StepProfiler(self.run_dir, frozenset())

    def start_rollout(self, step: int, published: Published) -> PendingRollout:
        """Batch `step` on every rollout host (or from a resumed run's checkpoint). Each host
        queues the call and starts it once its earlier calls are done (an actor runs its calls
        in order), whatever the other hosts' pace."""
        saved = self.restored.pop(step, None)
        if saved is None:
            calls = [self._generate(host, step, published) for host in self._rollout_hosts()]
        else:
            calls = [(ray.put(b.report), ray.put(b)) for b in saved]
        incarnations = [self.restarted[host] for host in self._rollout_hosts()]
        pending = PendingRollout(
            step=step, published=published, calls=calls, incarnations=incarnations
        )
        self.in_flight[step] = pending
        return pending

    def _rollout_hosts(self) -> range:
        return range(len(self.hosts.rollouts))

    def _generate(
        self, host: int, step: int, published: Published
    ) -> tuple[ray.ObjectRef, ray.ObjectRef]:
        return self.hosts.rollouts[host].generate.options(num_returns=2).remote(step, published)

    def collect_rollout(
        self, pending: PendingRollout, timer: StepTimer | None
    ) -> tuple[list[HalfReport], list]:
        """Every host's report of `pending`, and its batch refs for the trainers. A host that
        died is regenerated on its restarted actor with the same step and `Published` (the
        same prompts and sampling key; the weights the lost batch was started with)."""
        with timer.phase("trainer_idle") if timer else contextlib.nullcontext():
            reports = [self._report(pending, host) for host in range(len(pending.calls))]
        self.terms.reports[pending.step] = reports
        # A batch ref outlives its actor: the generate call returned (its report is here), so
        # the batch is owned by this driver and sits in this driver (small) or in the node's
        # object store (large), neither of which dies with the actor's worker process. Only a
        # lost node loses it; the trainers' fetch then fails and names the object.
        return reports, [batch for _, batch in pending.calls]

    def _report(self, pending: PendingRollout, host: int) -> HalfReport:
        while True:
            try:
                return ray.get(pending.calls[host][0])
            except HOST_LOST as error:
                if pending.incarnations[host] < self.restarted[host]:  # queued on a lost process
                    self._wait_restarted(host, step=pending.step, what="batch")
                else:
                    version = pending.published.version
                    self._await_restart(
                        host, error, step=pending.step, what="batch", version=version
                    )
                pending.incarnations[host] = self.restarted[host]
                pending.calls[host] = self._generate(host, pending.step, pending.published)

    def _await_restart(self, host: int, error: Exception, *, step: int, what: str, version: int):
        """Wait until Ray restarted rollout host `host` (its `__init__` rebuilt the half; the next
        call loads the `Published` weights it is given) and record that it redoes step `step`'s
        `what` ("batch" or "evaluation"); a host past its restart budget ends the run."""
        hosts = len(self.hosts.rollouts)
        alive = self.restarted[host] < self.rollout_restarts and self._wait_restarted(
            host, step=step, what=what
        )
        if not alive:
            raise RunFailed(
                f"rollout host {host} of {hosts} (a ray::RolloutHost actor) died during step "
                f"{step}'s {what} with no restarts left (placement.rollout_restarts="
                f"{self.rollout_restarts}, {self.restarted[host]} used; Ray: "
                f"{type(error).__name__}); the run stopped: find what kills it (out of memory?) "
                "or raise placement.rollout_restarts"
            ) from None
        self.restarted[host] += 1
        self.ledger.record_restart(host=host, step=step, regenerated=what, weight_version=version)

    def _wait_restarted(self, host: int, *, step: int, what: str) -> bool:
        """`wait_restarted` for rollout host `host`, within `restart_timeout_s`; past it the
        run ends with one sentence (no node took the host: its node was lost and no other has
        a free CPU), never a wait without end."""
        restarted = wait_restarted(self.hosts.rollouts[host], timeout_s=self.restart_timeout_s)
        if restarted is None:
            raise RunFailed(
                f"rollout host {host} of {len(self.hosts.rollouts)} (a ray::RolloutHost actor) "
                f"died during step {step}'s {what} and Ray did not restart it within "
                f"placement.rollout_restart_timeout_s={self.restart_timeout_s:g} s (was its node "
                "lost, with no free CPU on the others?); the run stopped: add a Ray node"
            )
        return restarted

    def start_train(self, step: int, batches: list, *, carried: dict | None) -> tuple[int, list]:
        # carried is None: O1 is refused under da (locoexp.applies)
        return step, [t.train.remote(step, batches) for t in self.hosts.trainers]

    def collect_train(self, pending: tuple[int, list], timer: StepTimer) -> list[TrainResult]:
        step, refs = pending
        with timer.phase("trainer_round"):
            results = self._from_trainers(refs, during=f"step {step}")
        self.ledger.record(results[0])
        self.in_flight.pop(step, None)
        self.terms.trained[step] = results
        return results

    def _from_trainers(self, refs: list, *, during: str) -> list:
        """Every trainer host's result; a dead trainer host (`RunFailed`), or one that refused
        with a sentence (`ConfigError`: a checkpoint it could not write), ends the run at once,
        without waiting for its peers (they may wait on it in a collective)."""
        left = list(refs)
        while left:
            ready, left = ray.wait(left, num_returns=1)
            try:
                ray.get(ready[0])
            except HOST_LOST as error:
                oom = isinstance(error, ray.exceptions.OutOfMemoryError)
                died = trainer_died(refs.index(ready[0]), len(refs), during, out_of_memory=oom)
                raise RunFailed(died) from None
            except ray.exceptions.RayTaskError as error:
                if isinstance(error.cause, ConfigError):  # its sentence, not the actor's trace
                    raise ConfigError(str(error.cause)) from None
                raise
        return ray.get(refs)

    def exchange(self, record: dict) -> list[dict]:
        """The driver already holds every host's report; it adds what its stale schedule
        measured (Eq. 4's A, the overlap with batch t+1's rollout: `terms.py`; batch t+1 is
        waited for here where the loop has not yet) and how often rollout hosts restarted."""
        step = int(record["step"])
        following = self.in_flight.get(step + 1)
        if following is not None and step + 1 not in self.terms.reports:
            self.collect_rollout(following, None)
        terms = self.terms.record_of(step)
        return [{**record, **terms, "da/rollout_restarts": self.ledger.restarts()}]

    def evaluate(self, published: Published, *, limit: int | None) -> float:
        """Held-out accuracy of `published`, each rollout host scoring its share (a restarted
        host scores its share again)."""
        results = []
        for host in self._rollout_hosts():
            while True:
                try:
                    call = self.hosts.rollouts[host].evaluate.remote(published, limit=limit)
                    results.append(ray.get(call))
                    break
                except HOST_LOST as error:
                    step = published.version - 1  # evaluation after `version` updates
                    self._await_restart(
                        host, error, step=step, what="evaluation", version=published.version
                    )
        correct, scored = np.sum(results, axis=0)
        return float(correct / max(scored, 1))

    @property
    def group(self) -> HostGroup:
        return DRIVER

    def checkpoint(self, checkpoints: RunCheckpoints, progress: RunProgress, *, wait: bool):
        """The checkpoint after `progress.next_step` updates: every batch in flight (started,
        not trained: batches k .. k+s-1, sampled with weights this checkpoint does not hold;
        `saved_batches`), then every trainer host's shards, the weight version and the ledger
        (`checkpoints` is the driver's; the trainer hosts write their own)."""
        updates = progress.next_step
        clear_batches(self.run_dir, updates)
        for step, pending in sorted(self.in_flight.items()):
            _, refs = self.collect_rollout(pending, None)
            save_batches(self.run_dir, updates, step, ray.get(refs))
        progress = dataclasses.replace(
            progress, weight_version=updates, ledger=tuple(self.ledger.rows)
        )
        run_dir = str(self.run_dir.resolve())
        calls = [
            t.save_checkpoint.remote(run_dir, progress, wait=wait) for t in self.hosts.trainers
        ]
        self._from_trainers(calls, during=f"the checkpoint after {updates} steps")
        kept = {int(p.name) for p in checkpoints.directory.glob("*") if p.name.isdigit()}
        prune_batches(self.run_dir, kept=kept | {updates})

    def restore(self, checkpoints: RunCheckpoints, progress: RunProgress) -> Published:
        """Continue from the checkpoint after `progress.next_step` updates: every trainer host
        restores its shards (from its own `RunCheckpoints`) and the restored weights are
        published; the batches the checkpoint saved are trained as they were generated, with
        the weights that sampled them (later ones are sampled with the restored weights)."""
        step, run_dir = progress.next_step, str(self.run_dir.resolve())
        calls = [t.restore_checkpoint.remote(run_dir, step) for t in self.hosts.trainers]
        published = self._from_trainers(calls, during=f"the restore of step {step}")[0]
        self.restored = load_batches(self.run_dir, step)
        return published

    def export(self, directory: Path, *, model: ModelConfig, tokenizer: Tokenizer) -> None:
        """The policy as a Hugging Face directory, written by trainer host 0."""
        calls = [
            t.export_policy.remote(str(directory), model, tokenizer) for t in self.hosts.trainers
        ]
        self._from_trainers(calls, during=f"the export to {directory}")


# The one process that runs the loop, records and decides under da (the trainer hosts' group is
# theirs, so JAX's preemption notice does not reach it: only its own signals count).
DRIVER = HostGroup(index=0, count=1)


def wait_restarted(actor, *, timeout_s: float) -> bool | None:
    """Wait until Ray restarted `actor` (True) or gave up on it: its restarts are spent or its
    `__init__` failed (False); None when neither happened within `timeout_s` (Ray waits for a
    node that can take it). Calls to a restarting actor fail at once (ActorUnavailableError)
    or wait until it runs again."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        probe = actor.__ray_ready__.remote()
        if not ray.wait([probe], timeout=left)[0]:
            return None
        try:
            ray.get(probe)
            return True
        except ray.exceptions.ActorUnavailableError:
            time.sleep(0.2)
        except ray.exceptions.RayActorError:
            return False
    return None


def trainer_died(host: int, hosts: int, during: str, *, out_of_memory: bool = False) -> str:
    actor = f"trainer host {host} of {hosts} (a ray::TrainerHost actor)"
    if out_of_memory:
        return (
            f"{actor} was killed by Ray's memory monitor during {during}: this machine ran out "
            "of memory (the dry run's plan counts each compiled program's buffers, not each "
            "process's runtime and allocator): run it with a smaller batch or fewer hosts"
        )
    return (
        f"{actor} died during {during}; the run stopped (trainer hosts hold the training state "
        "and are not restarted): run the same command again to resume from the last checkpoint"
    )


@contextlib.contextmanager
def ray_actors(
    layout: Layout,
    cluster: RaySpec,
    meet: CoordinatorSpec,
    halves: HalvesSpec,
    *,
    schedule: PromptSchedule,
    example_ids: list[int],
    run_dir: Path,
    ledger_rows: tuple[LedgerRow, ...],
    freeze_gc: bool,
    profile_steps: frozenset[int],
) -> Iterator[RayActors]:
    """Start Ray (`ray_session`) and one actor per host, each building its half of `halves`;
    the ledger (`batches.jsonl`, from a resumed run's `ledger_rows`) checks `schedule`'s batches
    of `example_ids`. Stop every actor, Ray and the ledger afterwards. A Ray error anywhere while
    a trainer host is dead (e.g. a rollout host that cannot fetch the weights that host
    published) is reported as that trainer host's death."""
    path, bound = run_dir / "batches.jsonl", layout.staleness
    ledger = BatchLedger(schedule, example_ids, path, max_staleness=bound, rows=ledger_rows)
    hosts = Hosts()
    try:
        with ray_session(layout, cluster, meet):
            try:
                start_hosts(
                    hosts,
                    layout,
                    cluster,
                    meet,
                    build_rollout=functools.partial(
                        build_actor_rollout_half, halves, schedule=schedule
                    ),
                    build_trainer=functools.partial(build_actor_trainer_half, halves),
                    freeze=freeze_gc,
                    profiler=StepProfiler(run_dir, profile_steps),
                )
                yield RayActors(
                    hosts=hosts,
                    ledger=ledger,
                    run_dir=run_dir,
                    rollout_restarts=cluster.rollout_restarts,
                    restart_timeout_s=cluster.rollout_restart_timeout_s,
                )
            except ray.exceptions.RayError:
                dead = dead_trainer(hosts.trainers)
                if dead is None:
                    raise
                raise RunFailed(trainer_died(dead, len(hosts.trainers), "the run")) from None
            finally:
                hosts.stop()
    finally:
        ledger.close()


def dead_trainer(trainers: list, *, probe_s: float = 5.0) -> int | None:
    """The first trainer host whose actor is dead, or None. A busy host answers after its
    current call; one that does not answer within `probe_s` counts as alive."""
    for index, trainer in enumerate(trainers):
        probe = trainer.__ray_ready__.remote()
        ready, _ = ray.wait([probe], timeout=probe_s)
        if not ready:
            continue
        try:
            ray.get(probe)
        except ray.exceptions.RayActorError:
            return index
    return None
