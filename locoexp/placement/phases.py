"""The phases of one step (the paper's Algorithm 1), shared by every placement.

admission -> generation -> reward + group advantage -> pack -> train -> publish -> log.
Each phase is a plain function of runtime objects; the two halves of a step (`halves.py`) compose
them for every placement and never re-implement one. Shapes: B prompts on this host, G samples
per prompt, N = B * G requests.
"""

import dataclasses
from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import Mesh

from locoexp.algo.config import AdvantageKind
from locoexp.algo.grpo import compute_group_advantages
from locoexp.dataset.schedule import PromptSchedule
from locoexp.dataset.task import Example, Task
from locoexp.placement.admission import AdmissionRecord, admit_requests
from locoexp.placement.multihost import gather_for_engine
from locoexp.rollout.config import SamplingParams
from locoexp.rollout.engine import Rollout
from locoexp.rollout.protocol import Engine
from locoexp.rollout.requests import RequestQueue


@dataclasses.dataclass(frozen=True)
class Admitted:
    """A host's share of one step: B examples and their N = B * G requests (groups contiguous),
    as submitted to the engine's request queue."""

    examples: list[Example]
    requests: list[np.ndarray]
    group_size: int
    record: AdmissionRecord  # what admission did


@dataclasses.dataclass(frozen=True)
class Scored:
    rewards: np.ndarray  # [B, G]
    advantages: np.ndarray  # [B, G]


def host_shares(prompts: int, hosts: int) -> list[int]:
    """Prompts per host: floor or ceil of B/H whole groups, the first B mod H hosts one more
    (`da`'s 3H/4 or 7H/8 rollout hosts never divide 128 or 256 prompts; Table F1)."""
    base, extra = divmod(prompts, hosts)
    return [base + (h < extra) for h in range(hosts)]


def split_across_hosts(
    indices: np.ndarray, lengths: np.ndarray, hosts: int, *, balance: bool
) -> list[np.ndarray]:
    """Give each host its `host_shares` of the prompts. O3 (Table B1): greedy longest-first to
    the lightest host with room left, so total prompt length per host is balanced; otherwise
    contiguous slices."""
    sizes = host_shares(len(indices), hosts)
    if not balance:
        ends = np.cumsum(sizes)
        return [indices[end - size : end] for size, end in zip(sizes, ends, strict=True)]
    loads = np.zeros(hosts)
    shares: list[list[int]] = [[] for _ in range(hosts)]
    for i in np.argsort(-lengths, kind="stable"):
        open_hosts = [h for h in range(hosts) if len(shares[h]) < sizes[h]]
        h = min(open_hosts, key=lambda j: loads[j])
        shares[h].append(indices[i])
        loads[h] += lengths[i]
    return [np.array(s, dtype=indices.dtype) for s in shares]


def admit(
    task: Task,
    schedule: PromptSchedule,
    step: int,
    *,
    host: int,
    hosts: int,
    group_size: int,
    balance: bool,
    queue: RequestQueue,
    pretokenized: bool,
    on_first_request: Callable[[], None] | None = None,
) -> Admitted:
    """Admission (Section 4.3, App. C Eq. 3): this host's share of the step's P prompts
    (`host_shares`: floor or ceil of P/H); each of their G requests is chat-rendered, tokenized
    and put on the engine's `queue` one at a time by this process (the single controller, one
    process, admits all P*G)."""
    indices = schedule.batch(step)
    lengths = np.array([len(task.train[i].prompt_tokens) for i in indices])
    mine = split_across_hosts(indices, lengths, hosts, balance=balance)[host]
    examples = [task.train[i] for i in mine]
    requests, record = admit_requests(
        task,
        examples,
        group_size=group_size,
        queue=queue,
        pretokenized=pretokenized,
        on_first_request=on_first_request,
    )
    return Admitted(examples=examples, requests=requests, group_size=group_size, record=record)


def generate(
    engine: Engine,
    queue: RequestQueue,
    *,
    key: jax.Array,
    max_new_tokens: int,
    sampling: SamplingParams,
) -> Rollout:
    """Generation: the local engine drains its request queue and completes every request."""
    prompts = [request.prompt_tokens for request in queue.drain()]
    return engine.generate(prompts, key=key, max_new_tokens=max_new_tokens, sampling=sampling)


def score(
    task: Task, admitted: Admitted, rollout: Rollout, *, advantage: AdvantageKind, eps: float
) -> Scored:
    """Reward and group advantage, on the host that generated the group (no communication)."""
    examples = [e for e in admitted.examples for _ in range(admitted.group_size)]
    completions = [rollout.completion(n) for n in range(len(examples))]
    rewards = task.score(examples, completions).reshape(-1, admitted.group_size)
    return Scored(rewards=rewards, advantages=compute_group_advantages(rewards, advantage, eps))


def publish(params, engine: Engine, *, mesh: Mesh, one_call: bool) -> None:
    """Weight publication: gather the FSDP shards into this host's engine replica (O4: every
    weight in one gather and one load; otherwise per layer)."""
    local = gather_for_engine(params, mesh, engine.devices, one_call=one_call, dtype=engine.dtype)
    load_into_engine(engine, local, one_call=one_call)


def load_into_engine(engine: Engine, params, *, one_call: bool) -> None:
    """O4's load (Table B1): a full replica into the engine in one call, else layer by layer;
    returns once the engine holds it (`publish` under co, d_L on a da rollout host)."""
    if one_call:
        engine.load_weights(params)
    else:
        engine.load_weights_per_layer(params)
    jax.block_until_ready(engine.params)


def rollout_metrics(admitted: Admitted, rollout: Rollout, scored: Scored) -> dict[str, float]:
    """Equal-work fields (Section 3.3) and reward of this host's share."""
    prompt_lengths = np.array([len(r) for r in admitted.requests])
    return {
        "rollout/reward_mean": float(scored.rewards.mean()),
        "rollout/prompt_tokens_mean": float(prompt_lengths.mean()),
        "rollout/completion_tokens_mean": float(rollout.lengths.mean()),
        "rollout/completion_tokens_max": int(rollout.lengths.max()),
        "rollout/truncated_share": float(rollout.truncated.mean()),
        "rollout/sequences": len(admitted.requests),
        "rollout/tokens_in": int(prompt_lengths.sum()),
        "rollout/tokens_out": int(rollout.lengths.sum()),
        "rollout/decode_iterations": rollout.decode_iterations,
        "rollout/waves": rollout.waves,
        **({} if rollout.refills is None else {"rollout/refills": rollout.refills}),
        **(
            {}
            if rollout.slot_occupancy is None
            else {"rollout/slot_occupancy": rollout.slot_occupancy}
        ),
    }
