"""LoRA on every model family `adapter=lora` accepts: Qwen3-MoE (attention only: its MLP is
expert stacks) and Gemma4 (no v_proj on key-is-value global layers) adapt the projections they
have, as PEFT does on the same transformers model (fp32, 1e-4); a train step runs with the
adapters where expected; a target a model does not have is refused at start-up."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh
from safetensors.numpy import load_file

from locoexp.adapter.config import AdapterConfig, AdapterKind, Projection
from locoexp.adapter.lora import adapt_model, load_factors
from locoexp.adapter.peft import (
    ADAPTER_WEIGHTS_FILE,
    peft_config,
    read_peft_adapter,
    write_peft_adapter,
)
from locoexp.algo.config import AlgoConfig
from locoexp.compose import compose_config
from locoexp.errors import ConfigError
from locoexp.model.checkpoint import load_model
from locoexp.model.moe import is_expert_stack
from locoexp.model.transformer import build_model, causal_segment_mask
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.packing import pack_sequences
from locoexp.trainer.trainer import Trainer

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
import test_gemma4_parity as gemma4  # noqa: E402
import test_moe_parity as qwen3_moe  # noqa: E402

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
EVERY = AdapterConfig(kind=AdapterKind.lora, rank=4, alpha=8.0)  # targets null: all it has


def adapted_paths(model) -> set[tuple]:
    """(layer, module, projection) of every adapter of an adapted model."""
    flat = nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
    return {(path[1], path[2], path[3]) for path, _ in flat}


def expected(layers: dict[int, list[str]]) -> set[tuple]:
    return {
        (i, "attn" if p in ATTENTION else "mlp", p) for i, names in layers.items() for p in names
    }


# model -> the (layer, module, projection) its default LoRA adapts, written out by hand
FAMILIES = {
    "tiny": expected({0: ATTENTION + MLP, 1: ATTENTION + MLP}),
    # Qwen3-MoE: the MLP's gate/up/down are [E, ...] expert stacks, not adapted
    "tiny_qwen3_moe": expected({0: ATTENTION, 1: ATTENTION}),
    # Gemma4-26B's shape: local layers 0, 1; layer 2 global, keys are values (no v_proj); the
    # dense GeLU MLP beside the experts is adapted in every layer
    "tiny_gemma4_moe": expected(
        {0: ATTENTION + MLP, 1: ATTENTION + MLP, 2: ["q_proj", "k_proj", "o_proj", *MLP]}
    ),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_default_lora_adapts_each_projection_the_model_has(name):
    config = compose_config(["adapter=lora", f"model={name}"])
    adapted = adapt_model(build_model(config.model, seed=0), config.adapter)
    assert adapted_paths(adapted) == FAMILIES[name]
    factors = jax.tree.leaves(nnx.state(adapted, nnx.LoRAParam))
    assert sum(x.size for x in factors) == config.adapter.count_factors(config.model)


def test_the_factors_of_a_dense_mlp_beside_experts_are_not_split_as_expert_stacks():
    config = compose_config(["adapter=lora", "model=tiny_gemma4_moe"])
    adapted = adapt_model(build_model(config.model, seed=0), config.adapter)
    # key paths as the trainer's and the engine's layouts see them (jax.tree_util's)
    paths = [p for p, _ in jax.tree_util.tree_leaves_with_path(nnx.state(adapted, nnx.Param))]
    stacks = {tuple(str(k.key) for k in p[2:4]) for p in paths if is_expert_stack(p)}
    assert stacks == {("experts", "gate_up_proj"), ("experts", "down_proj")}  # mlp's are dense


@pytest.mark.parametrize("name", ["tiny_qwen3_moe", "tiny_gemma4_moe"])
@pytest.mark.slow
def test_a_train_step_moves_the_adapters_and_leaves_the_experts_frozen(name):
    config = compose_config(["adapter=lora", f"model={name}"])
    trainer = Trainer(
        build_model(config.model, seed=0), AlgoConfig(learning_rate=1e-2), TrainerConfig(),
        mesh=Mesh(np.array(jax.devices()), ("fsdp",)), temperature=1.0, max_new_tokens=4,
        adapter=config.adapter,
    )  # fmt: skip
    assert adapted_paths(trainer._model(trainer.trainable, trainer.frozen)) == FAMILIES[name]
    trained = sum(x.size for x in jax.tree.leaves(trainer.trainable))
    assert trained == config.adapter.count_parameters(config.model)
    before = {p: np.asarray(v[...]) for p, v in nnx.to_flat_state(trainer.params)}
    rng = np.random.default_rng(2)
    prompts = [rng.integers(1, 16, size=n) for n in (3, 5, 4, 6)]
    completions = [rng.integers(1, 16, size=4) for _ in prompts]
    behaviour = [np.full(4, -2.8, np.float32) for _ in prompts]
    advantages = np.array([1.0, -1.0, 1.0, -1.0], np.float32)
    metrics = trainer.train_step(
        pack_sequences(prompts, completions, behaviour, advantages, row_tokens=16)
    )
    assert np.isfinite(metrics["train/loss"])
    after = {p: np.asarray(v[...]) for p, v in nnx.to_flat_state(trainer.params)}
    moved = {p for p in after if np.any(after[p] != before[p])}
    adapted = {(i, module, proj, "kernel") for i, module, proj in FAMILIES[name]}
    assert {("layers", *p) for p in adapted} | {("embed", "embedding")} == moved


@pytest.fixture(scope="module", params=["qwen3_moe", "gemma4_dense_k_eq_v", "gemma4_moe_k_eq_v"])
def peft_family(request, tmp_path_factory):
    """A random transformers base of the family, a random PEFT adapter on the projections we
    adapt by default (on Gemma4 all seven names: PEFT skips the global layers' absent v_proj),
    its directory and logits."""
    base_dir, adapter_dir = (tmp_path_factory.mktemp(n) for n in ("base", "adapter"))
    if request.param == "qwen3_moe":
        hf, targets = qwen3_moe.build_hf_moe(8, 2, True, False), ATTENTION
        model = qwen3_moe.matching_config(8, 2, True, False, checkpoint=str(base_dir))
    else:
        moe = request.param == "gemma4_moe_k_eq_v"
        hf, targets = gemma4.build_hf_gemma4(moe, True), ATTENTION + MLP
        model = gemma4.matching_config(moe, True, checkpoint=str(base_dir))
    hf.save_pretrained(base_dir)
    config = peft.LoraConfig(
        r=EVERY.rank, lora_alpha=EVERY.alpha, target_modules=targets, init_lora_weights=False
    )
    torch.manual_seed(1)
    adapted = peft.get_peft_model(hf, config).eval()
    adapted.save_pretrained(adapter_dir)
    tokens = np.random.default_rng(0).integers(0, 97, size=(2, 12))
    with torch.no_grad():
        logits = adapted(input_ids=torch.tensor(tokens)).logits.numpy()
    return model, adapter_dir, tokens, logits


def test_lora_on_moe_and_key_is_value_layers_matches_peft(peft_family, tmp_path):
    model_config, adapter_dir, tokens, expected_logits = peft_family
    adapted = adapt_model(load_model(model_config, seed=0), EVERY)
    factors = read_peft_adapter(adapter_dir, model_config)
    # PEFT adapted exactly the projections we did
    assert {p[1:4] for p in factors} == adapted_paths(adapted)
    load_factors(adapted, factors)
    ids = jnp.asarray(tokens)
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    hidden, _ = adapted(ids, positions, causal_segment_mask(jnp.ones_like(ids)))
    np.testing.assert_allclose(
        np.asarray(adapted.logits(hidden)), expected_logits, atol=1e-4, rtol=0
    )
    # and writes peft's tensors, its config naming the modules it adapted
    ours = load_file(
        str(write_peft_adapter(factors, EVERY, model_config, tmp_path) / ADAPTER_WEIGHTS_FILE)
    )
    theirs = load_file(str(adapter_dir / ADAPTER_WEIGHTS_FILE))
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        np.testing.assert_array_equal(ours[name], tensor)
    assert set(peft_config(EVERY, model_config)["target_modules"]) == {p[3] for p in factors}


REFUSED = {
    # Qwen3-MoE's gate/up/down are expert stacks
    "expert stack": (
        ["model=tiny_qwen3_moe", "adapter.targets=[q_proj,gate_proj]"],
        "adapter.targets names gate_proj, which model tiny_qwen3_moe has no projection of (its "
        "MLP is a mixture of experts, whose stacks LoRA here does not adapt); valid targets: "
        "q_proj, k_proj, v_proj, o_proj, or null for all of them.",
    ),
    # every layer global with keys as values: no layer has a v_proj
    "no value projection": (
        ["model=tiny_gemma4_moe", "model.global_attention_every=1", "adapter.targets=[v_proj]"],
        "adapter.targets names v_proj, which model tiny_gemma4_moe has no projection of; valid "
        "targets: q_proj, k_proj, o_proj, gate_proj, up_proj, down_proj, or null for all of "
        "them.",
    ),
}


@pytest.mark.parametrize("overrides, sentence", REFUSED.values(), ids=REFUSED.keys())
def test_a_target_the_model_does_not_have_is_refused_naming_the_valid_ones(overrides, sentence):
    with pytest.raises(ConfigError) as refused:
        compose_config(["adapter=lora", *overrides])
    assert str(refused.value) == sentence
    # where some layers have it, v_proj is adapted there (Gemma4's local layers)
    config = compose_config(["adapter=lora", "model=tiny_gemma4_moe", "adapter.targets=[v_proj]"])
    assert config.adapter.targets == [Projection.v_proj]
