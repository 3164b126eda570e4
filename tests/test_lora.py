"""LoRA (`adapter=lora`) against `peft` on the same base and adapter (fp32, 1e-4), and the
trainer's frozen base: only the adapters (and PEFT's `modules_to_save`, trained in full) train
and hold optimizer state."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh
from safetensors.numpy import load_file

from locoexp.adapter.config import (
    AdapterConfig,
    AdapterKind,
    Projection,
    SavedModule,
    saved_tensors,
)
from locoexp.adapter.lora import adapt_model, load_factors, load_saved, merge_adapters
from locoexp.adapter.peft import (
    ADAPTER_WEIGHTS_FILE,
    read_peft_adapter,
    read_saved_modules,
    write_peft_adapter,
)
from locoexp.algo.config import AlgoConfig
from locoexp.checkpoint.export import ADAPTER_DIR, export_trainer_policy
from locoexp.errors import ConfigError
from locoexp.model.checkpoint import load_model
from locoexp.model.transformer import causal_segment_mask
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.packing import pack_sequences
from locoexp.trainer.trainer import Trainer

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
from hf_models import build_hf_model, matching_model_config  # noqa: E402

from locoexp.dataset.synthetic import DigitTokenizer  # noqa: E402

SHAPE = dict(family="qwen3", heads=4, kv_heads=2, head_dim=16, tied=False)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = AdapterConfig(
    kind=AdapterKind.lora, rank=4, alpha=8.0, targets=[Projection(t) for t in TARGETS]
)
# PEFT's modules_to_save: the embedding (and the head tied to it) and, as PEFT matches names by
# their end, every norm in full
SAVED = ["embed_tokens", "norm"]
LORA_SAVED = dataclasses.replace(LORA, modules_to_save=[SavedModule(m) for m in SAVED])
LORA_HEAD = dataclasses.replace(LORA, modules_to_save=[SavedModule.lm_head])  # untied, [D, V]
TIED = {**SHAPE, "tied": True}


def locoexp_logits(model, tokens: np.ndarray) -> np.ndarray:
    tokens = jnp.asarray(tokens)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    hidden, _ = model(tokens, positions, causal_segment_mask(jnp.ones_like(tokens)))
    return np.asarray(model.logits(hidden))


@pytest.fixture(scope="module")
def peft_reference(tmp_path_factory):
    """A random base saved by transformers, a random (B != 0) PEFT adapter on it, and the
    adapted model's logits under peft."""
    base_dir, adapter_dir = (tmp_path_factory.mktemp(n) for n in ("base", "adapter"))
    hf = build_hf_model(**SHAPE)
    hf.save_pretrained(base_dir)
    config = peft.LoraConfig(
        r=LORA.rank, lora_alpha=LORA.alpha, target_modules=TARGETS, init_lora_weights=False
    )
    torch.manual_seed(1)
    adapted = peft.get_peft_model(hf, config).eval()
    adapted.save_pretrained(adapter_dir)
    tokens = np.random.default_rng(0).integers(0, 97, size=(2, 12))
    with torch.no_grad():
        logits = adapted(input_ids=torch.tensor(tokens)).logits.numpy()
    return base_dir, adapter_dir, tokens, logits


@pytest.fixture(scope="module")
def peft_saved_reference(tmp_path_factory):
    """A random tied base saved by transformers, a PEFT adapter with random factors and
    `modules_to_save` (the embedding, the head tied to it, every norm) moved off the base,
    and its logits under peft."""
    base_dir, adapter_dir = (tmp_path_factory.mktemp(n) for n in ("tied", "saved"))
    hf = build_hf_model(**TIED)
    hf.save_pretrained(base_dir)
    config = peft.LoraConfig(
        r=LORA.rank, lora_alpha=LORA.alpha, target_modules=TARGETS, init_lora_weights=False,
        modules_to_save=SAVED, ensure_weight_tying=True,
    )  # fmt: skip
    torch.manual_seed(1)
    adapted = peft.get_peft_model(hf, config).eval()
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "modules_to_save" in name:
                param.add_(0.1 * torch.randn_like(param))
    adapted.save_pretrained(adapter_dir)
    tokens = np.random.default_rng(0).integers(0, 97, size=(2, 12))
    with torch.no_grad():
        logits = adapted(input_ids=torch.tensor(tokens)).logits.numpy()
    return base_dir, adapter_dir, tokens, logits


def test_lora_logits_match_peft_within_1e4(peft_reference):
    base_dir, adapter_dir, tokens, expected = peft_reference
    model_config = matching_model_config(**SHAPE, checkpoint=str(base_dir))
    base = load_model(model_config, seed=0)
    adapted = adapt_model(base, LORA)
    load_factors(adapted, read_peft_adapter(adapter_dir, model_config))
    actual = locoexp_logits(adapted, tokens)
    plain = locoexp_logits(base, tokens)
    assert np.abs(expected - plain).max() > 1e-2  # the adapter changes the logits
    np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=0)
    # the merged weights (what the engines load) are the same function
    graphdef, params = nnx.split(base, nnx.Param)
    merged = merge_adapters(nnx.to_pure_dict(nnx.state(adapted, nnx.Param)), scale=LORA.scale)
    nnx.replace_by_pure_dict(params, merged)
    np.testing.assert_allclose(
        locoexp_logits(nnx.merge(graphdef, params), tokens), expected, atol=1e-4, rtol=0
    )


def test_modules_to_save_match_peft_and_are_written_as_peft_writes_them(
    peft_saved_reference, tmp_path
):
    base_dir, adapter_dir, tokens, expected = peft_saved_reference
    model_config = matching_model_config(**TIED, checkpoint=str(base_dir))
    base = load_model(model_config, seed=0)
    adapted = adapt_model(base, LORA_SAVED)
    factors, saved = (f(adapter_dir, model_config) for f in (read_peft_adapter, read_saved_modules))
    assert set(saved) == set(saved_tensors(LORA_SAVED, model_config))
    assert len([p for p in saved if p[-1] == "scale"]) == 2 * 4 + 1  # input, post, q, k; final
    load_factors(adapted, factors)
    load_saved(adapted, saved)  # the trained embedding is the tied head too, as in peft
    np.testing.assert_allclose(locoexp_logits(adapted, tokens), expected, atol=1e-4, rtol=0)
    written = write_peft_adapter(factors, LORA_SAVED, model_config, tmp_path, saved=saved)
    ours, peft_file = (load_file(str(d / ADAPTER_WEIGHTS_FILE)) for d in (written, adapter_dir))
    assert set(ours) == set(peft_file)
    for name, tensor in peft_file.items():
        np.testing.assert_array_equal(ours[name], tensor)


def test_unknown_or_absent_modules_to_save_are_refused():
    from locoexp.compose import compose_config  # noqa: PLC0415

    with pytest.raises(ConfigError, match="expected one of"):
        compose_config(["adapter=lora", "adapter.modules_to_save=[embeddings]"])
    config = compose_config(["adapter=lora", "adapter.modules_to_save=[lm_head]"])
    with pytest.raises(ConfigError, match="its head is tied: name embed_tokens"):
        config.adapter.count_parameters(config.model)


def test_adapt_model_leaves_the_base_unchanged_and_starts_as_the_base(peft_reference):
    base_dir, _, tokens, _ = peft_reference
    base = load_model(matching_model_config(**SHAPE, checkpoint=str(base_dir)), seed=0)
    before = locoexp_logits(base, tokens)
    adapted = adapt_model(base, LORA)  # B = 0: the same function
    np.testing.assert_allclose(locoexp_logits(adapted, tokens), before, atol=1e-6, rtol=0)
    assert not nnx.state(base, nnx.LoRAParam)  # the base model gained no adapters
    lora = nnx.state(adapted, nnx.LoRAParam)
    assert len(jax.tree.leaves(lora)) == 2 * len(TARGETS) * 2  # A and B, 7 targets, 2 layers


@pytest.mark.parametrize("adapter", [LORA, LORA_SAVED], ids=["lora", "lora+saved"])
def test_trainer_updates_only_the_adapters_and_holds_adam_state_only_for_them(
    peft_reference, adapter
):
    base_dir, _, _, _ = peft_reference
    model_config = matching_model_config(**SHAPE, checkpoint=str(base_dir))
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    algo = AlgoConfig(learning_rate=1e-2, kl_coef=0.05)
    trainer = Trainer(
        load_model(model_config, seed=0), algo, TrainerConfig(), mesh=mesh, temperature=1.0,
        max_new_tokens=4, adapter=adapter,
    )  # fmt: skip
    base_before = jax.tree.map(np.asarray, trainer.frozen)
    policy_before = jax.tree.map(np.asarray, trainer.params)
    adapter_leaves = jax.tree.leaves(trainer.trainable)
    assert sum(x.size for x in adapter_leaves) == adapter.count_parameters(model_config)
    moments = [x for x in jax.tree.leaves(trainer.opt_state) if x.ndim > 0]
    assert sum(x.size for x in moments) == 2 * sum(x.size for x in adapter_leaves)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(1, 97, size=n) for n in (3, 5, 4, 6)]
    completions = [rng.integers(1, 97, size=4) for _ in prompts]
    behaviour = [trainer.temperature * np.full(4, -4.6, np.float32) for _ in prompts]
    advantages = np.array([1.0, -1.0, 1.0, -1.0], np.float32)
    batch = pack_sequences(prompts, completions, behaviour, advantages, row_tokens=16)
    metrics = trainer.train_step(batch)
    assert np.isfinite(metrics["train/loss"])
    jax.tree.map(
        np.testing.assert_array_equal, jax.tree.map(np.asarray, trainer.frozen), base_before
    )
    after = dict(nnx.to_flat_state(trainer.params))
    before = dict(nnx.to_flat_state(policy_before))
    moved = {path for path, v in after.items() if np.any(np.asarray(v[...]) != before[path][...])}
    assert {("layers", i, "attn", "q_proj", "kernel") for i in (0, 1)} <= moved
    saved = set(saved_tensors(adapter, model_config)) if adapter.modules_to_save else set()
    assert ("embed", "embedding") in saved or not adapter.modules_to_save
    assert all(path[-1] == "kernel" and path[-2] in TARGETS for path in moved - saved)
    assert saved <= moved  # trained in full, and published (`params`) as trained
    trained = dict(nnx.to_flat_state(trainer.trainable))
    for path in saved:
        np.testing.assert_array_equal(np.asarray(after[path][...]), trained[path][...])
    state = trainer.state()
    assert set(state) == {"adapters", "opt_state", "reference"}


@pytest.mark.parametrize(
    ("reference", "shape", "adapter"),
    [
        ("peft_reference", SHAPE, LORA),
        ("peft_saved_reference", TIED, LORA_SAVED),
        ("peft_reference", SHAPE, LORA_HEAD),
    ],
    ids=["lora", "lora+saved", "lora+head"],
)
def test_exported_adapter_loads_in_peft_beside_the_merged_policy(
    request, tmp_path, reference, shape, adapter
):
    base_dir, _, tokens, _ = request.getfixturevalue(reference)
    model_config = matching_model_config(**shape, checkpoint=str(base_dir))
    trainer = Trainer(
        load_model(model_config, seed=0),
        AlgoConfig(),
        TrainerConfig(),
        mesh=Mesh(np.array(jax.devices()), ("fsdp",)),
        temperature=1.0,
        max_new_tokens=4,
        adapter=adapter,
    )
    # adapters (and saved modules) as after training: B moved off zero, the embedding moved
    trainer.trainable = jax.tree.map(
        lambda x: x + 0.05 * jnp.cos(jnp.arange(x.size)).reshape(x.shape), trainer.trainable
    )
    directory = export_trainer_policy(trainer, model_config, DigitTokenizer(), tmp_path / "final")
    merged = locoexp_logits(nnx.merge(trainer.graphdef, trainer.params), tokens)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager")
    with torch.no_grad():
        from_peft = peft.PeftModel.from_pretrained(base, directory / ADAPTER_DIR).eval()
        adapted = from_peft(input_ids=torch.tensor(tokens)).logits.numpy()
        hf_merged = transformers.AutoModelForCausalLM.from_pretrained(
            directory, attn_implementation="eager"
        )(input_ids=torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(adapted, merged, atol=1e-4, rtol=0)
    np.testing.assert_allclose(hf_merged, merged, atol=1e-4, rtol=0)


def test_plan_counts_gradients_and_adamw_state_of_the_adapters_only():
    from locoexp.compose import compose_config  # noqa: PLC0415
    from locoexp.planner.fit import resolve_plan  # noqa: PLC0415
    from locoexp.session.build import plan_setup  # noqa: PLC0415

    cell = ["model=qwen3_1_7b", "hardware=tpu_v7x_4", "dataset=gsm8k", "algo.kl_coef=0.08"]
    full = resolve_plan(plan_setup(compose_config(cell)))
    config = compose_config([*cell, "adapter=lora"])
    lora = resolve_plan(plan_setup(config))
    adapters = config.adapter.count_parameters(config.model)
    assert adapters == 28 * 64 * (2 * (2048 + 2048) + 2 * (2048 + 1024) + 3 * (2048 + 6144))
    shard = -(-adapters // lora.trainer_shape.devices) * 4  # float32
    assert lora.trainer.optimizer == 2 * shard and lora.trainer.reference == shard
    assert lora.trainer.params == full.trainer.params + shard
    assert lora.trainer.merged == full.trainer.params  # the policy merged for publication
    assert lora.trainer.optimizer < full.trainer.optimizer / 20
    assert lora.trainer_peak < full.trainer_peak
    # the embedding in full (modules_to_save): its AdamW state and reference, no second copy
    config = compose_config([*cell, "adapter=lora", "adapter.modules_to_save=[embed_tokens]"])
    saved = resolve_plan(plan_setup(config))
    trained = -(-(adapters + 151_936 * 2048) // lora.trainer_shape.devices) * 4
    assert config.adapter.count_parameters(config.model) == adapters + 151_936 * 2048
    assert saved.trainer.optimizer == 2 * trained and saved.trainer.reference == trained
    assert saved.trainer.params == lora.trainer.params
