"""The typed root `Config`: one field per config group plus the run-level keys.

`locoexp.compose` composes YAML with Hydra and converts it into this dataclass; everything below
`locoexp.main` receives only the sub-config or runtime object it needs. Cross-group invariants
(placement vs split, batch vs hosts) are checked here, and every key this run does not read is
refused by the one table of `locoexp.applies`, so a bad run fails before anything is allocated
or written. Nothing is written back: `hardware.hosts: null` is resolved by `Config.hosts`.
"""

import dataclasses
import enum
import math
from typing import Any

from locoexp.adapter.config import AdapterConfig, check_targets
from locoexp.algo.config import AlgoConfig
from locoexp.applies import RunTraits, refuse_unread_keys
from locoexp.checkpoint.config import ResumeMode
from locoexp.dataset.config import DatasetConfig
from locoexp.errors import require
from locoexp.hardware.config import ChipKind, HardwareConfig
from locoexp.layout import Layout, build_layout, minimal_hosts
from locoexp.metrics.config import LoggerConfig
from locoexp.model.config import ModelConfig
from locoexp.placement.config import OptConfig, PlacementConfig
from locoexp.rollout.config import KVCacheKind, RolloutConfig
from locoexp.trainer.config import TrainerConfig, check_attention_backend, check_remat_backend


class DryRun(enum.Enum):
    """`dry_run`: run (false), print the plan (true), or compile for the slice (compile)."""

    false = "false"
    true = "true"
    compile = "compile"

    def __bool__(self) -> bool:
        return self is not DryRun.false


def _dry_run(value: object) -> DryRun:
    text = str(value.value if isinstance(value, DryRun) else value).lower()
    require(
        text in DryRun._value2member_map_,
        f"dry_run={value} is not valid: use false (run), true (print the plan) or compile "
        "(compile every program for the TPU slice with XLA).",
    )
    return DryRun(text)


@dataclasses.dataclass(kw_only=True)
class Config:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    adapter: AdapterConfig = dataclasses.field(default_factory=AdapterConfig)
    dataset: DatasetConfig = dataclasses.field(default_factory=DatasetConfig)
    hardware: HardwareConfig = dataclasses.field(default_factory=HardwareConfig)
    placement: PlacementConfig = dataclasses.field(default_factory=PlacementConfig)
    opt: OptConfig = dataclasses.field(default_factory=OptConfig)
    algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    logger: LoggerConfig = dataclasses.field(default_factory=LoggerConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    # placement=da: the trainer's share of the hosts (the paper's splits: 0.5, 0.25, 0.125).
    split: float | None = None
    seed: int = 0  # model init and sampling
    # Repeat index of an otherwise identical run (Appendix A: launches per arm). It changes no
    # computation; a sweep over it (`launch: 0,1`) gives each repeat its own run directory.
    launch: int = 0
    steps: int = 150  # optimizer updates (one per batch)
    eval_every_steps: int = 25  # held-out evaluation period; 0 = only after the last step
    # Scored checkpoints by update count, as Table I3's [275, 300, 325, 348]; added to the above.
    eval_at_updates: list[int] = dataclasses.field(default_factory=list)
    # Cost-to-learn (Appendix I.1): held-out accuracy that two consecutive evaluations must reach.
    eval_target: float = 0.9
    # Training-state checkpoint period (orbax, under <run_dir>/checkpoints); 0 = only at the end
    # and when the run is stopped by SIGTERM/SIGINT, which always checkpoint.
    checkpoint_every_steps: int = 25
    # A run directory that holds a checkpoint: auto = resume from it (else start at step 0),
    # never = refuse it, must = refuse a run directory without one.
    resume: ResumeMode = ResumeMode.auto
    # true: print the plan (hosts, devices, memory, parameters) and exit; compile: compile every
    # program of each role for the run's TPU slice with XLA (libtpu, no TPU needed) and print
    # XLA's memory per program and its verdict (locoexp/compiled). Typed Any because Hydra
    # reads `dry_run=true` as a bool; `__post_init__` turns it into a `DryRun`.
    dry_run: Any = False
    # Steps (0-based) to capture with `jax.profiler` and split into compute / network / host
    # orchestration (Table H1; `breakdown/*_share` in the records). Traces stay in
    # `<run_dir>/profile/step<t>/` for TensorBoard and Perfetto; capture and parsing are kept off
    # the step clock. Each host profiles its own process.
    profile_steps: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.dry_run = _dry_run(self.dry_run)
        _require_finite(self, prefix="")
        # GRPO and Dr. GRPO compare each sample with its group's mean (Section I.1): a group of
        # one has advantage 0, so every step would train on a zero gradient.
        require(
            self.dataset.samples_per_prompt >= 2,
            f"dataset.samples_per_prompt={self.dataset.samples_per_prompt} gives every sample a "
            f"zero group advantage under algo.advantage={self.algo.advantage.value}; set "
            "dataset.samples_per_prompt>=2 (Table 1 uses 8 or 16).",
        )
        require(self.steps >= 1, f"steps={self.steps} must be a positive integer.")
        require(self.launch >= 0, f"launch={self.launch} must be >= 0 (a repeat index).")
        require(
            self.eval_every_steps >= 0, f"eval_every_steps={self.eval_every_steps} must be >= 0."
        )
        require(
            self.checkpoint_every_steps >= 0,
            f"checkpoint_every_steps={self.checkpoint_every_steps} must be >= 0 (0 = only at the "
            "end and on SIGTERM/SIGINT).",
        )
        require(0 < self.eval_target <= 1, f"eval_target={self.eval_target} must be in (0, 1].")
        require(
            all(1 <= u <= self.steps for u in self.eval_at_updates),
            f"eval_at_updates={self.eval_at_updates} must lie in [1, steps={self.steps}].",
        )
        require(
            all(0 <= t < self.steps for t in self.profile_steps),
            f"profile_steps={self.profile_steps} must lie in [0, steps={self.steps}).",
        )
        check_attention_backend(self.trainer.attention, self.hardware.platform)
        check_remat_backend(self.trainer.remat, self.hardware.platform)
        refuse_unread_keys(self, self.traits)  # a key this run does not read (locoexp.applies)
        check_targets(self.adapter, self.model)  # LoRA on the projections the model has
        self._check_placement()
        self._check_placement_values()
        self._check_straggler()
        self._check_page_pool()

    @property
    def hosts(self) -> int:
        """H: `hardware.hosts`, or (`hardware.hosts: null`, hardware=cpu) the smallest count the
        placement and split need. Resolved here, never written back into `hardware`."""
        if self.hardware.hosts is not None:
            return self.hardware.hosts
        return minimal_hosts(self.placement.kind, split=self.split)

    @property
    def layout(self) -> Layout:
        """Who runs where: the placement on the resolved hosts. Refuses a `da` split that gives
        no whole host counts."""
        hw, placement = self.hardware, self.placement
        return build_layout(
            placement.kind,
            hosts=self.hosts,
            devices_per_host=hw.devices_per_host,
            split=self.split,
            max_staleness=placement.max_staleness,
            cpu=hw.chip is ChipKind.cpu,
        )

    @property
    def resolved_hardware(self) -> HardwareConfig:
        """A copy of `hardware` with `hosts` resolved, what the plan and the compile read."""
        return dataclasses.replace(self.hardware, hosts=self.hosts)

    @property
    def traits(self) -> RunTraits:
        """What decides which keys this run reads (`locoexp.applies`)."""
        m, straggler = self.model, self.rollout.straggler
        return RunTraits(
            family=m.family,
            moe=m.moe,
            rope_scaled=m.rope_scaling_factor != 1.0,
            adapter=self.adapter.kind,
            engine=self.rollout.engine,
            kv_cache=self.rollout.kv_cache,
            dataset=self.dataset.kind,
            local_files=self.dataset.data_files is not None,
            layout=self.layout,
            tpu=self.hardware.chip is not ChipKind.cpu,
            cluster_launched=self.hardware.cluster_launched,
            attention=self.trainer.attention,
            accumulate=self.trainer.accumulate,
            advantage=self.algo.advantage,
            logger=self.logger.kind,
            straggler=straggler.active,
        )

    def _check_page_pool(self) -> None:
        """A paged engine's pool holds one row at its caps, or that row could never finish (its
        prompt is stored from position 0, so the caps are what it needs, not the bucket)."""
        pages, page = self.rollout.kv_cache_pages_per_replica, self.rollout.page_tokens
        if self.rollout.kv_cache is not KVCacheKind.paged or pages is None:
            return
        tokens = self.dataset.max_prompt_tokens + self.dataset.max_new_tokens
        require(
            pages * page >= tokens,
            f"rollout.kv_cache_pages_per_replica={pages} cannot hold one row at its caps "
            f"(dataset.max_prompt_tokens + dataset.max_new_tokens = {tokens} tokens need "
            f"{-(-tokens // page)} pages of rollout.page_tokens={page}): set it to at least "
            f"{-(-tokens // page)}, or null for every slot at its caps.",
        )

    def _check_straggler(self) -> None:
        """`rollout.straggler.host` names one of the run's rollout engines: every host under co,
        the single controller's one process, the rollout hosts under da."""
        host, layout = self.rollout.straggler.host, self.layout
        require(
            host is None or host < layout.engines,
            f"rollout.straggler.host={host} is not one of the {layout.engines} rollout hosts of "
            f"placement={layout.kind.value} (valid: 0..{layout.engines - 1}, or null for a "
            "seeded draw).",
        )

    def _check_placement(self) -> None:
        """Batch shapes per layout: whole GRPO groups per rollout engine."""
        layout, prompts = self.layout, self.dataset.prompts_per_step
        # colocated: each engine admits the same whole GRPO groups (Algorithm 1)
        require(
            layout.disaggregated or prompts % layout.engines == 0,
            f"dataset.prompts_per_step={prompts} must be divisible by "
            f"hardware.hosts={layout.engines}: each host admits whole GRPO groups (Algorithm 1).",
        )
        if layout.disaggregated:
            self._check_da_batch(layout)

    def _check_da_batch(self, layout: Layout) -> None:
        trainers, rollouts, d = layout.trainer_hosts, layout.rollout_hosts, self.dataset
        # Each rollout host admits floor or ceil of P/R whole GRPO groups (`phases.
        # split_across_hosts`): the paper's 0.25 and 0.125 splits leave 3H/4 or 7H/8 rollout hosts,
        # which never divide 128 or 256 prompts (Table F1, Section 4.4), and ran that way.
        require(
            d.prompts_per_step >= rollouts,
            f"dataset.prompts_per_step={d.prompts_per_step} gives some of the {rollouts} rollout "
            "hosts of placement=da no GRPO group; use at least as many prompts as rollout hosts.",
        )
        sequences = d.prompts_per_step * d.samples_per_prompt
        require(
            sequences % trainers == 0,
            f"dataset.prompts_per_step x dataset.samples_per_prompt = {sequences} sequences must "
            f"be divisible by the {trainers} trainer hosts of placement=da.",
        )

    def _check_placement_values(self) -> None:
        """The placement keys' values; where each applies is `locoexp.applies`' (O2-O4 act under
        every placement; O1 and the Ray keys where their rows say)."""
        staleness = self.placement.max_staleness
        require(
            staleness >= 1,
            f"placement.max_staleness={staleness} must be a positive integer (the paper's: 1).",
        )
        # a bound raised past the run's length holds nothing back (the paper's 1 always applies)
        require(
            staleness in (1, *range(self.steps)),
            f"placement.max_staleness={staleness} is not below steps={self.steps}: no batch of "
            "this run can be that stale, so the bound holds nothing back; set "
            "placement.max_staleness below steps, or 1 (the paper's).",
        )
        require(
            self.placement.rollout_restarts >= 0,
            f"placement.rollout_restarts={self.placement.rollout_restarts} must be >= 0 (0: a "
            "dead rollout host ends the run).",
        )
        require(
            self.placement.rollout_restart_timeout_s > 0,
            f"placement.rollout_restart_timeout_s={self.placement.rollout_restart_timeout_s} "
            "must be > 0 (seconds the driver waits for Ray to restart a lost rollout host).",
        )


def _require_finite(node, *, prefix: str) -> None:
    """Every float key of the config is a finite number (inf or nan would train on NaN)."""
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if dataclasses.is_dataclass(value):
            _require_finite(value, prefix=f"{prefix}{field.name}.")
        elif isinstance(value, float):
            require(
                math.isfinite(value),
                f"{prefix}{field.name}={value} must be a finite number.",
            )


def config_keys(path: str) -> list[str]:
    """The keys under `path` of the schema ("" = the root, "algo", "dataset.synthetic"); empty
    when `path` names no group."""
    node: type[Any] = Config
    for part in filter(None, path.split(".")):
        field_type = {f.name: f.type for f in dataclasses.fields(node)}.get(part)
        if not (isinstance(field_type, type) and dataclasses.is_dataclass(field_type)):
            return []
        node = field_type
    return sorted(f.name for f in dataclasses.fields(node))
