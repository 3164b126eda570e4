"""The train step (Algorithm 1, line 5): one forward/backward and one AdamW update, FSDP-sharded.

The trainer holds the policy parameters and optimizer state sharded over a mesh axis `fsdp` (each
parameter split along its largest dimension that the device count divides), takes a `PackedBatch`,
places it as the step's pytree `TrainBatch` (rows and loss slots split over `fsdp`) and returns
scalar metrics. A mixture-of-experts policy may add an `expert` axis (`trainer.expert_parallel`,
`trainer_mesh`): its expert stacks split E/EP along it, FSDP along `fsdp`, everything else and the
rows over both axes together. Memory knobs (`TrainerConfig`): the attention kernel, per-block
rematerialisation and micro-batches with gradient accumulation (`trainer/micro.py`). It never
generates and never knows about placement; `params` is what weight publication hands to the engines.

With `adapter=lora` the base weights are frozen (`frozen`, never differentiated, no optimizer
state) and only the LoRA factors (`trainable`, with the `adapter.modules_to_save` weights in
full) train; `params` is then the merged policy W + (alpha / r) A B (`locoexp.adapter.lora`),
so publication and export see a plain model.

Shapes: R rows, L row tokens, K loss slots, D width, V vocabulary.
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as PS

from locoexp.adapter.config import AdapterConfig
from locoexp.adapter.lora import adapt_model, merge_adapters, trained_filter
from locoexp.algo.config import AlgoConfig
from locoexp.algo.grpo import loss_denominator
from locoexp.model.attention import AttentionSpec
from locoexp.model.config import AttentionKind, RematPolicy
from locoexp.model.moe import EXPERT, expert_mesh, is_expert_stack
from locoexp.model.transformer import Transformer, router_loss
from locoexp.trainer.config import TrainerConfig, check_attention_backend, check_remat_backend
from locoexp.trainer.head import HeadLossSpec, head_grads_at_slots, slot_fields
from locoexp.trainer.micro import (
    MicroLayout,
    accumulate_grads,
    group_slots,
    hidden_in_micro_batches,
)
from locoexp.trainer.packing import ROW_FIELDS, PackedBatch, PackedRows, TrainBatch, train_view


def fsdp_spec(shape: tuple[int, ...], devices: int, axis_name: str | tuple = "fsdp") -> PS:
    """Shard the largest dimension that `devices` divides; replicate when none does."""
    for axis in sorted(range(len(shape)), key=lambda a: -shape[a]):
        if devices > 1 and shape[axis] % devices == 0:
            return PS(*[(axis_name if a == axis else None) for a in range(len(shape))])
    return PS()


def trainer_mesh(devices, expert_parallel: int = 1) -> Mesh:
    """The trainer's mesh over `devices`: one `fsdp` axis, or (fsdp, expert) with EP
    consecutive devices along `expert` (`trainer.expert_parallel`)."""
    if expert_parallel == 1:
        return Mesh(np.array(devices), ("fsdp",))
    return Mesh(np.array(devices).reshape(-1, expert_parallel), ("fsdp", EXPERT))


def _all_devices(mesh: Mesh) -> str | tuple[str, ...]:
    """The axis name (or names) that together span every device of `mesh`."""
    return mesh.axis_names[0] if len(mesh.axis_names) == 1 else tuple(mesh.axis_names)


def param_spec(path: tuple, shape: tuple[int, ...], mesh: Mesh) -> PS:
    """An expert stack [E, ...] splits E over `expert` and FSDP over `fsdp`; any other
    parameter (and every one on a mesh without an expert axis) FSDP over all devices."""
    if EXPERT in mesh.axis_names and is_expert_stack(path):
        return PS(EXPERT, *fsdp_spec(shape[1:], mesh.shape["fsdp"]))
    return fsdp_spec(shape, mesh.devices.size, _all_devices(mesh))


def build_optimizer(algo: AlgoConfig) -> optax.GradientTransformation:
    """AdamW with optional linear warm-up (then constant or cosine decay) and global-norm
    clipping."""
    if algo.cosine_decay_steps:
        lr = optax.warmup_cosine_decay_schedule(
            0.0, algo.learning_rate, algo.warmup_steps, algo.cosine_decay_steps
        )
    elif algo.warmup_steps:
        lr = optax.linear_schedule(0.0, algo.learning_rate, algo.warmup_steps)
    else:
        lr = algo.learning_rate
    adamw = optax.adamw(
        lr, b1=algo.adam_b1, b2=algo.adam_b2, eps=algo.adam_eps, weight_decay=algo.weight_decay
    )
    if algo.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(algo.max_grad_norm), adamw)
    return adamw


BLOCKWISE = AttentionSpec(kind=AttentionKind.blockwise)


def row_hidden(
    model: Transformer,
    rows: PackedRows[jax.Array],
    *,
    attention: AttentionSpec = BLOCKWISE,
    remat: RematPolicy = RematPolicy.none,
) -> jax.Array:
    """Final hidden states [R, L, D] of packed rows (tokens, positions, segment_ids [R, L])."""
    return model.packed_hidden(*rows, attention=attention, remat=remat)


def at_loss_positions(hidden: jax.Array, loss_index: jax.Array) -> jax.Array:
    """[R, L, D] -> [K, D] at the positions that predict the loss targets."""
    return hidden.reshape(-1, hidden.shape[-1])[loss_index]


def loss_position_hidden(model: Transformer, batch: TrainBatch[jax.Array], **forward) -> jax.Array:
    """Final hidden states [K, D] at the positions that predict the loss targets."""
    return at_loss_positions(row_hidden(model, batch.rows, **forward), batch.loss_index)


def head_weight(model: Transformer) -> jax.Array:
    """The output head as [V, D]: the tied embedding, or the lm_head kernel transposed."""
    if model.config.tie_embeddings:
        return model.embed.embedding[...]
    return model.lm_head.kernel[...].T


def token_logprobs(
    model: Transformer, batch: TrainBatch[jax.Array], *, temperature: float, chunk: int
) -> jax.Array:
    """Log-probs [K] of the loss targets under softmax(logits / T), the head run in chunks
    (a forward pass: the train step runs the fused head per device, `Trainer._head_on_own_rows`)."""
    hidden = loss_position_hidden(model, batch)
    return head_logprobs(model, hidden, batch.loss_targets, temperature=temperature, chunk=chunk)


def head_logprobs(
    model: Transformer, hidden: jax.Array, targets: jax.Array, *, temperature: float, chunk: int
) -> jax.Array:
    """Log-probs [K] of `targets` [K] given the hidden states [K, D] at their positions."""
    scale = 1.0 / temperature if temperature > 0 else 1.0

    def chunk_logprobs(args):
        h, targets = args
        logits = model.logits(h) * scale
        picked = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
        return picked - jax.nn.logsumexp(logits, axis=-1)

    k = hidden.shape[0]
    size = min(chunk, k)
    padded = -(-k // size) * size  # the last chunk is padded with copies of slot 0, then dropped
    if padded != k:
        hidden = jnp.concatenate(
            [hidden, jnp.broadcast_to(hidden[:1], (padded - k, hidden.shape[1]))]
        )
        targets = jnp.concatenate([targets, jnp.broadcast_to(targets[:1], (padded - k,))])
    chunks = (hidden.reshape(padded // size, size, -1), targets.reshape(padded // size, size))
    return jax.lax.map(chunk_logprobs, chunks).reshape(padded)[:k]


def batch_shardings(mesh: Mesh) -> TrainBatch[NamedSharding]:
    """Where each leaf of the step's `TrainBatch` lives: rows [R, L] and loss slots [K] split
    over `fsdp` along their first axis, the normalizer on every device."""

    def split(ndim: int) -> NamedSharding:
        return NamedSharding(mesh, PS(_all_devices(mesh), *([None] * (ndim - 1))))

    return TrainBatch(
        **{name: split(2) for name in ROW_FIELDS},
        loss_index=split(1),
        loss_targets=split(1),
        loss_mask=split(1),
        advantages=split(1),
        behaviour_logprobs=split(1),
        normalizer=NamedSharding(mesh, PS()),
    )


def _abstractly(tree, shardings):
    """`tree`'s leaves as ShapeDtypeStructs placed by `shardings` (nothing allocated)."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def shard_like_fsdp(mesh: Mesh, state) -> object:
    """Each leaf's `param_spec` sharding on `mesh`."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, param_spec(path, x.shape, mesh)), state
    )


class Trainer:
    """Policy parameters, AdamW state and the jitted GRPO train step on a `fsdp` mesh."""

    def __init__(
        self,
        model: Transformer,
        algo: AlgoConfig,
        config: TrainerConfig,
        *,
        mesh: Mesh,
        temperature: float,
        max_new_tokens: int,
        adapter: AdapterConfig | None = None,
        abstract: bool = False,
    ):
        # abstract: `model` comes from `nnx.eval_shape` and the state stays ShapeDtypeStructs on
        # `mesh` (nothing allocated): the step compiles for the mesh's devices, which may be a
        # TPU topology's without a TPU (`locoexp.planner.compiled`)
        platform = mesh.devices.flat[0].platform
        check_attention_backend(config.attention, platform)
        check_remat_backend(config.remat, platform)
        self.abstract = abstract
        self.algo, self.config, self.mesh = algo, config, mesh
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.moe, self.router_aux_loss_coef = model.config.moe, model.config.router_aux_loss_coef
        # a mixture of experts routes each device's own tokens (rows split over every device)
        self._token_axes = tuple(mesh.axis_names) if self.moe else ()
        owners = [d.process_index for d in mesh.devices.flat]
        if owners != sorted(owners):
            raise ValueError("the trainer mesh must list each process's devices contiguously")
        self.adapter = adapter or AdapterConfig()
        params, trainable = self._place_state(model)
        self._init_optimizer(trainable)
        self.loss_spec = HeadLossSpec(
            clip_eps_low=algo.clip_eps_low,
            clip_eps_high=algo.clip_eps_high,
            kl_coef=algo.kl_coef,
            tis_cap=algo.tis_cap,
            aggregation=algo.loss_aggregation,
            temperature=temperature,
            chunk=config.logit_chunk_tokens,
            softcap=model.config.final_logit_softcap,
        )
        self.attention = AttentionSpec(
            kind=config.attention,
            block_tokens=config.attention_block_tokens,
            rows=NamedSharding(mesh, PS(_all_devices(mesh))) if mesh.devices.size > 1 else None,
        )
        self.batch_shardings = batch_shardings(mesh)
        self.steps_done = 0
        self._step = jax.jit(
            self._train_step,
            donate_argnums=(0, 1),
            out_shardings=(self.param_shardings, self.opt_shardings, NamedSharding(mesh, PS())),
        )
        self._logprobs = jax.jit(self._logprobs_fn)
        self._merge = jax.jit(self._merged_policy, out_shardings=shard_like_fsdp(mesh, params))

    def _place_state(self, model: Transformer) -> tuple[nnx.State, nnx.State]:
        """The trained and frozen states on the mesh (ShapeDtypeStructs when abstract), and the
        KL reference; returns the plain policy's parameters and the trained state, unplaced."""
        # the plain policy's structure: what publication and export hand on
        self.graphdef, params = nnx.split(model, nnx.Param)
        self._plain_shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        trainable, frozen = self._split_trainable(model, params)
        self.param_shardings = shard_like_fsdp(self.mesh, trainable)
        place = _abstractly if self.abstract else jax.device_put
        self.trainable = place(trainable, self.param_shardings)
        self.frozen = place(frozen, shard_like_fsdp(self.mesh, frozen))
        # a copy: the step donates self.trainable, which must not free the reference (under
        # LoRA the reference is the initial adapters on the frozen base: the base model)
        copy = (lambda tree: tree) if self.abstract else (lambda tree: jax.tree.map(jnp.copy, tree))
        self.reference = copy(self.trainable) if self.algo.kl_coef > 0 else None
        return params, trainable

    def _init_optimizer(self, trainable: nnx.State) -> None:
        """AdamW's state for `trainable`, placed (abstractly when abstract)."""
        self.optimizer = build_optimizer(self.algo)
        # Optimizer moments shard like their parameters; counters are replicated. Fixing the
        # output shardings keeps every step's inputs identical to the first's (one compile).
        replicated = NamedSharding(self.mesh, PS())
        self.opt_shardings = optax.tree_map_params(
            self.optimizer,
            lambda _, sharding: sharding,
            jax.eval_shape(self.optimizer.init, trainable),
            self.param_shardings,
            transform_non_params=lambda _: replicated,
        )
        init = jax.jit(self.optimizer.init, out_shardings=self.opt_shardings)
        self.opt_state = (
            _abstractly(jax.eval_shape(init, trainable), self.opt_shardings)
            if self.abstract
            else init(self.trainable)
        )

    def _split_trainable(self, model: Transformer, params):
        """(trainable, frozen) states; sets `train_graphdef`, what the step merges them with.
        Full fine-tuning trains `params` and freezes nothing."""
        if not self.adapter.trains_adapters:
            self.train_graphdef = self.graphdef
            return params, nnx.State({})
        adapted = adapt_model(model, self.adapter)
        train = trained_filter(self.adapter, model.config)
        self.train_graphdef, *states = nnx.split(adapted, train, nnx.Param)
        trainable, frozen = states
        return trainable, frozen

    def _model(self, trainable, frozen) -> Transformer:
        return nnx.merge(self.train_graphdef, trainable, frozen)

    def _merged_policy(self, trainable, frozen):
        """The plain policy's parameters: the adapters folded into the base (W + s A B)."""
        adapted = nnx.to_pure_dict(nnx.state(self._model(trainable, frozen), nnx.Param))
        merged = merge_adapters(adapted, scale=self.adapter.scale)
        state = jax.tree.map(lambda x: x, self._plain_shapes)  # a fresh State to fill
        nnx.replace_by_pure_dict(state, merged)
        return state

    @property
    def params(self):
        """The policy's parameters in the plain model's structure (`graphdef`): what weight
        publication hands to the engines and export writes; merged under LoRA (a new copy)."""
        if not self.adapter.trains_adapters:
            return self.trainable
        return self._merge(self.trainable, self.frozen)

    @property
    def policy_shapes(self):
        """The plain policy's parameters as placed ShapeDtypeStructs: what `params` returns."""
        return _abstractly(self._plain_shapes, shard_like_fsdp(self.mesh, self._plain_shapes))

    def lower_merge(self) -> jax.stages.Lowered:
        """The merge of the adapters into the policy (`params` under adapter=lora), lowered."""
        return self._merge.lower(self.trainable, self.frozen)

    @property
    def devices(self) -> int:
        return self.mesh.devices.size

    @property
    def local_devices(self) -> int:
        """This process's trainer devices: its packed rows are split over them."""
        return sum(d.process_index == jax.process_index() for d in self.mesh.devices.flat)

    def device_batch(self, batch: PackedBatch) -> TrainBatch[jax.Array]:
        """Assemble the global `TrainBatch` from every process's packed rows (rows and loss slots
        split over fsdp, `batch_shardings`). Every process must pass the same number of rows and
        slots; process p's rows are global rows [p * R, (p + 1) * R), so its flat loss indices
        shift by p * R * L."""
        processes, index = jax.process_count(), jax.process_index()
        rows, row_tokens = batch.tokens.shape
        local = train_view(
            batch,
            normalizer=batch.num_sequences * processes * self.max_new_tokens,
            index_offset=index * rows * row_tokens,
        )

        def place(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
            split = len(sharding.spec) > 0  # split along rows / slots; else the same everywhere
            shape = (x.shape[0] * processes, *x.shape[1:]) if split else x.shape
            return jax.make_array_from_process_local_data(sharding, x, shape)

        return jax.tree.map(place, local, self.batch_shardings)

    def _layout(self, batch: TrainBatch[jax.Array]) -> MicroLayout:
        return MicroLayout.of(batch.tokens.shape[0], self.devices, self.config.micro_batch_rows)

    def _hidden_fn(
        self, params, rows: PackedRows[jax.Array], *, frozen
    ) -> tuple[jax.Array, jax.Array]:
        """The decoder over packed rows [M, L] -> [M, L, D] with the configured kernel/remat,
        and the router's load-balancing loss over their real tokens (0 for a dense model)."""
        model = self._model(params, frozen)
        hidden, stats = model.packed_hidden_and_router(
            *rows, attention=self.attention, remat=self.config.remat
        )
        return hidden, router_loss(stats)

    def _loss_hidden(self, params, frozen, batch: TrainBatch[jax.Array]) -> jax.Array:
        """Hidden states [K, D] at the loss positions, micro-batch by micro-batch (forward only)."""
        hidden_fn = functools.partial(self._hidden_fn, frozen=frozen)
        hidden = hidden_in_micro_batches(hidden_fn, params, batch.rows, self._layout(batch))
        return at_loss_positions(hidden, batch.loss_index)

    def _logprobs_fn(self, params, frozen, batch: TrainBatch[jax.Array]):
        return head_logprobs(
            self._model(params, frozen),
            self._loss_hidden(params, frozen, batch),
            batch.loss_targets,
            temperature=self.temperature,
            chunk=self.config.logit_chunk_tokens,
        )

    def _accumulated_grads(self, params, frozen, batch: TrainBatch[jax.Array], layout: MicroLayout):
        """The same loss, metrics and gradients, one micro-batch's activations at a time
        (`trainer/micro.py`): each micro-batch's decoder runs forward under its vjp, the fused
        head runs over that micro-batch's own loss slots, and the vjp pulls their gradient
        back, so the body runs forward once per step, as in the one-shot step."""
        spec = self.loss_spec
        weight, weight_vjp = jax.vjp(lambda p: head_weight(self._model(p, frozen)), params)
        fields = slot_fields(spec, batch)
        mask = fields["mask"]
        row_tokens = batch.tokens.shape[1]
        groups, chunks = group_slots(layout, row_tokens, batch.loss_index, fields, chunk=spec.chunk)
        denominator = loss_denominator(mask, spec.aggregation, batch.normalizer)

        own_slots = self._head_on_own_rows(
            spec, weight, denominator, row_tokens * layout.micro_rows
        )

        def head_fn(hidden, group, dweight):
            slots, count = group
            loss, sums, dhidden, group_dweight = own_slots(hidden, slots, count)
            return dhidden, dweight + group_dweight, (loss, sums)

        grads, dweight, ((losses, sums), aux) = accumulate_grads(
            functools.partial(self._hidden_fn, frozen=frozen),
            params,
            batch.rows,
            layout,
            (groups, chunks),
            head_fn,
            jnp.zeros(weight.shape, jnp.float32),
            aux_weight=self.router_aux_loss_coef,
        )
        (head_grads,) = weight_vjp(dweight.astype(weight.dtype))
        grads = jax.tree.map(lambda g, h, p: (g + h).astype(p.dtype), grads, head_grads, params)
        count = jnp.maximum(mask.sum(), 1.0)
        metrics = {key: value.sum() / count for key, value in sums.items()}
        return self._with_router_loss(losses.sum(), metrics, aux.mean()), grads

    def _head_on_own_rows(self, spec: HeadLossSpec, weight, denominator, span: int):
        """The fused head over one micro-batch's slot group run by each device on its own rows
        and its own lane of slots (`jax.shard_map`), the loss, its terms and dLoss/dW summed
        over devices after. Left to XLA's partitioner, the slots' gather from row-sharded
        hidden states cannot know that lane d only indexes device d's rows: it gathers every
        device's slots on every device and reduces (XLA-TPU laid out two [K, D] buffers of
        32 GiB per device for Qwen3-8B at 64 chips, Table E1) and the head's chunks ran on
        every device. `span` = m * L, the flat positions of one device's rows."""
        axis = _all_devices(self.mesh)
        scatter = weight.shape[0] % self.mesh.devices.size == 0

        def local(hidden, weight, slots, count, denominator):
            flat = hidden.reshape(-1, hidden.shape[-1])
            slots = {**slots, "index": slots["index"] % span}  # lane d indexes device d's rows
            zeros = jnp.zeros(weight.shape, jnp.float32)
            loss, sums, dflat, dweight = head_grads_at_slots(
                spec, flat, weight, slots, count, denominator, zeros
            )
            loss, sums = jax.lax.psum((loss, sums), axis)
            if scatter:  # the sum lands split along V, as FSDP keeps the weight
                dweight = jax.lax.psum_scatter(dweight, axis, scatter_dimension=0, tiled=True)
            else:
                dweight = jax.lax.psum(dweight, axis)
            return loss, sums, dflat.reshape(hidden.shape), dweight

        def run(hidden, slots, count):
            rows, lanes = PS(axis), jax.tree.map(lambda _: PS(axis), slots)
            mapped = jax.shard_map(
                local,
                mesh=self.mesh,
                in_specs=(rows, PS(), lanes, PS(), PS()),
                out_specs=(PS(), PS(), rows, rows if scatter else PS()),
                check_vma=False,
            )
            return mapped(hidden, weight, slots, count, denominator)

        return run

    def _with_router_loss(self, loss, metrics, aux):
        """The GRPO loss plus `model.router_aux_loss_coef` x the load-balancing loss (a
        mixture-of-experts model; Qwen3-30B-A3B publishes 0.001), the latter as a metric."""
        if not self.moe:
            return loss, metrics
        return loss + self.router_aux_loss_coef * aux, {**metrics, "train/router_loss": aux}

    def _loss_and_grads(self, params, frozen, batch: TrainBatch[jax.Array], reference):
        if reference is not None:  # the KL reference: a forward pass, no gradient
            ref_logprobs = jax.lax.stop_gradient(self._logprobs_fn(reference, frozen, batch))
            batch = dataclasses.replace(batch, ref_logprobs=ref_logprobs)
        # one micro-batch (the paper's layout) runs the same per-device head as many
        return self._accumulated_grads(params, frozen, batch, self._layout(batch))

    def _train_step(self, params, opt_state, frozen, batch: TrainBatch[jax.Array], reference):
        (loss, metrics), grads = self._loss_and_grads(params, frozen, batch, reference)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        params = jax.lax.with_sharding_constraint(params, self.param_shardings)
        metrics = {**metrics, "train/loss": loss, "train/grad_norm": optax.tree.norm(grads)}
        return params, opt_state, metrics

    def train_step(self, batch: PackedBatch) -> dict[str, float]:
        """One optimizer update on `batch`; returns host-side scalar metrics."""
        placed = self.device_batch(batch)
        with expert_mesh(self.mesh, self._token_axes):
            self.trainable, self.opt_state, metrics = self._step(
                self.trainable, self.opt_state, self.frozen, placed, self.reference
            )
        self.steps_done += 1
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    @property
    def _trainable_key(self) -> str:
        return "adapters" if self.adapter.trains_adapters else "params"

    def state(self) -> dict:
        """The arrays a training-state checkpoint holds: what trains (the parameters, or under
        LoRA the adapters; the frozen base is rebuilt from `model`), AdamW state, and the KL
        reference (the initial policy) when the loss has a KL term."""
        state = {self._trainable_key: self.trainable, "opt_state": self.opt_state}
        if self.reference is not None:
            state["reference"] = self.reference
        return state

    def load_state(self, state: dict, *, steps_done: int) -> None:
        """Continue from `state()` of an earlier trainer after `steps_done` updates (arrays
        already placed like ours)."""
        self.trainable, self.opt_state = state[self._trainable_key], state["opt_state"]
        self.steps_done = steps_done
        if self.reference is not None:
            self.reference = state["reference"]

    def loss_and_grads(self, batch: PackedBatch):
        """((loss, metrics), gradients) of the step on `batch`, without an update (tests)."""
        placed = self.device_batch(batch)
        with expert_mesh(self.mesh, self._token_axes):
            return self._loss_and_grads_program(self.trainable, self.frozen, placed, self.reference)

    @functools.cached_property
    def _loss_and_grads_program(self):
        return jax.jit(self._loss_and_grads)  # one program per trainer, not one per call

    def abstract_batch(
        self, rows: int, row_tokens: int, slots: int
    ) -> TrainBatch[jax.ShapeDtypeStruct]:
        """The step's batch of `rows` x `row_tokens` packed rows and `slots` loss slots (all
        devices together) as placed ShapeDtypeStructs: what a compile reads of a batch."""
        shapes: TrainBatch[tuple[tuple[int, ...], Any]] = TrainBatch(
            **{name: ((rows, row_tokens), jnp.int32) for name in ROW_FIELDS},
            loss_index=((slots,), jnp.int32),
            loss_targets=((slots,), jnp.int32),
            loss_mask=((slots,), jnp.float32),
            advantages=((slots,), jnp.float32),
            behaviour_logprobs=((slots,), jnp.float32),
            normalizer=((), jnp.float32),
        )
        return jax.tree.map(
            lambda spec, s: jax.ShapeDtypeStruct(*spec, sharding=s),
            shapes,
            self.batch_shardings,
            is_leaf=lambda x: isinstance(x, tuple),
        )

    def lower_step(self, batch: PackedBatch | TrainBatch[Any]) -> jax.stages.Lowered:
        """The train step lowered for `batch`'s shapes (`.compile().memory_analysis()`): a
        host batch, or an `abstract_batch`."""
        placed = batch if isinstance(batch, TrainBatch) else self.device_batch(batch)
        with expert_mesh(self.mesh, self._token_axes):
            return self._step.lower(
                self.trainable, self.opt_state, self.frozen, placed, self.reference
            )

    def logprobs(self, batch: PackedBatch) -> np.ndarray:
        """The trainer's recomputation of this process's loss targets' log-probs [K]."""
        with expert_mesh(self.mesh, self._token_axes):
            values = self._logprobs(self.trainable, self.frozen, self.device_batch(batch))
        if values.is_fully_addressable:
            return np.asarray(values)
        local = [
            shard.data
            for shard in sorted(values.addressable_shards, key=lambda s: s.index[0].start)
        ]
        return np.concatenate([np.asarray(x) for x in local])
