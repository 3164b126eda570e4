"""The trained policy out: a Hugging Face directory that transformers loads with the same logits
and that `model.checkpoint=` runs from again; `model.checkpoint=<Hub id>` from a local cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from locoexp.algo.config import AlgoConfig
from locoexp.checkpoint.export import export_policy, policy_directory
from locoexp.model.checkpoint import load_model
from locoexp.model.config import ModelConfig
from locoexp.model.transformer import build_model, causal_segment_mask
from locoexp.tokenizer.digits import DigitTokenizer
from locoexp.tokenizer.hf import HFTokenizer
from locoexp.tokenizer.qwen3 import Qwen3Tokenizer
from locoexp.trainer.config import TrainerConfig
from locoexp.trainer.trainer import Trainer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = ModelConfig()  # conf/model/tiny.yaml: the embedded default's model


def _logits(model, tokens):
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    hidden, _ = model(tokens, positions, causal_segment_mask(jnp.ones_like(tokens)))
    return np.asarray(model.logits(hidden))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The trainer's policy (parameters moved off the seed init) exported with its tokenizer."""
    trainer = Trainer(
        build_model(TINY, seed=1),
        AlgoConfig(),
        TrainerConfig(),
        mesh=Mesh(np.array(jax.devices()), ("fsdp",)),
        temperature=1.0,
        max_new_tokens=4,
    )
    trainer.trainable = jax.tree.map(
        lambda x: x + 0.01 * jnp.sin(jnp.arange(x.size)).reshape(x.shape), trainer.params
    )
    directory = policy_directory(tmp_path_factory.mktemp("run"), updates=None)
    assert export_policy(trainer.params, trainer.graphdef, TINY, DigitTokenizer(), directory)
    return directory, nnx.merge(trainer.graphdef, trainer.params)


@pytest.mark.slow
def test_transformers_loads_the_exported_policy_with_the_same_logits(exported):
    directory, policy = exported
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in directory.iterdir()
    }
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager")
    tokens = jax.random.randint(jax.random.key(0), (2, 9), 0, TINY.vocab_size)
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor(np.asarray(tokens))).logits.float().numpy()
    np.testing.assert_allclose(_logits(policy, tokens), expected, atol=1e-4, rtol=0)
    assert np.abs(_logits(build_model(TINY, seed=1), tokens) - expected).max() > 1e-3


def test_the_exported_tokenizer_encodes_like_the_runs(exported):
    directory, _ = exported
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    ours = DigitTokenizer()
    for text in ("123=", "9 0 7 =", "0000"):
        assert hf.encode(text, add_special_tokens=False) == ours.encode(text)
    assert hf.decode(ours.encode("42=")) == "42="
    assert (hf.eos_token_id, hf.pad_token_id) == (ours.eos_id, ours.pad_id)


def test_w1s_id_tokenizer_is_written_as_ids_a_hugging_face_tokenizer_reads_back(tmp_path):
    from locoexp.tokenizer.files import write_tokenizer_files
    from locoexp.tokenizer.ids import IdTokenizer

    ours = IdTokenizer(vocab_size=1000)
    write_tokenizer_files(ours, tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in ("17 4 999", "0 1 2"):
        assert hf.encode(text, add_special_tokens=False) == ours.encode(text)
    assert hf.decode(ours.encode("5 17 300")) == "5 17 300"
    assert (hf.eos_token_id, hf.pad_token_id) == (ours.eos_id, ours.pad_id)


def test_model_checkpoint_loads_the_export_with_its_parameters(exported):
    directory, policy = exported
    loaded = load_model(ModelConfig(checkpoint=str(directory)), seed=0)
    tokens = jnp.arange(8).reshape(1, 8)
    np.testing.assert_array_equal(_logits(loaded, tokens), _logits(policy, tokens))


@pytest.mark.slow
def test_a_run_starts_again_from_the_exported_policy(exported, tmp_path, compose):
    from locoexp.main import run

    directory, _ = exported
    config = compose(
        [
            f"model.checkpoint={directory}",
            "steps=1",
            "logger=none",
            "dataset.prompts_per_step=4",
            "dataset.samples_per_prompt=4",
            "dataset.synthetic.held_out_size=8",  # the final evaluation: 8 prompts, not 200
        ]
    )
    summary = run(config, run_dir=tmp_path, progress=False)
    assert summary["steps"] == 1


def test_the_builtin_qwen3_tokenizer_exports_as_an_equal_hf_tokenizer(tmp_path):
    from locoexp.tokenizer.files import write_tokenizer_files

    write_tokenizer_files(Qwen3Tokenizer(), tmp_path)
    ours, theirs = Qwen3Tokenizer(), HFTokenizer(tmp_path)
    text = "Natalia sold 48 clips<|im_end|> café 数学 \n\n  x"
    assert theirs.encode(text) == ours.encode(text)
    assert (theirs.eos_id, theirs.pad_id, theirs.vocab_size) == (
        ours.eos_id,
        ours.pad_id,
        ours.vocab_size,
    )
    messages = [{"role": "user", "content": "What is 2+2?"}]
    for thinking in (False, True):
        assert theirs.render_chat(
            messages, add_generation_prompt=True, thinking=thinking
        ) == ours.render_chat(messages, add_generation_prompt=True, thinking=thinking)
