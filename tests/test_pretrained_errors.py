"""Bad checkpoints get an error naming the tensor or file; nothing is half-loaded or half-written."""
import json
import shutil
import warnings

import numpy as np
import pytest
import transformers
from safetensors.numpy import load_file, save_file

import bert_jax
from bert_jax import config_lib
from bert_jax.pretrained import LoadError, Pretrained
from bert_jax.state_dict import ConversionError

SIZES = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=32)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf") / "bert"
    transformers.BertForPreTraining(transformers.BertConfig(**SIZES)).save_pretrained(directory)
    return directory


@pytest.fixture
def checkpoint(bert_dir, tmp_path):
    """A fresh copy to damage."""
    return shutil.copytree(bert_dir, tmp_path / "bert")


def load(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no tokenizer files here
        return bert_jax.load_pretrained(path, **kwargs)


def edit_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))


def edit_tensors(directory, edit):
    tensors = load_file(directory / "model.safetensors")
    edit(tensors)
    save_file(tensors, directory / "model.safetensors")


def test_unknown_architecture(checkpoint):
    edit_config(checkpoint, model_type="gpt2")
    with pytest.raises(ConversionError, match="model_type='gpt2'"):
        load(checkpoint)


def test_mismatched_architecture(checkpoint):
    edit_config(checkpoint, model_type="albert")
    with pytest.raises(ConversionError, match="this is a bert checkpoint.*family='albert'"):
        load(checkpoint)


def test_missing_and_extra_tensors_are_named(checkpoint):
    def edit(tensors):
        del tensors["bert.encoder.layer.1.attention.self.key.bias"]
        tensors["bert.encoder.layer.1.adapter.weight"] = np.zeros(3, np.float32)

    edit_tensors(checkpoint, edit)
    with pytest.raises(ConversionError, match="missing tensors: bert.encoder.layer.1.attention.self.key.bias; "
                                              "unexpected tensors: bert.encoder.layer.1.adapter.weight"):
        load(checkpoint)


def test_shape_mismatch_is_named(checkpoint):
    edit_config(checkpoint, intermediate_size=48)
    with pytest.raises(ConversionError, match=r"layer_0/intermediate/kernel: checkpoint \(32, 64\) vs model \(32, 48\)"):
        load(checkpoint)


def test_truncated_safetensors_names_the_file(checkpoint):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(LoadError, match=f"{weights}: cannot read this safetensors file.*truncated"):
        load(checkpoint)


def test_directory_without_a_checkpoint(tmp_path):
    with pytest.raises(LoadError, match="not a checkpoint"):
        load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(LoadError, match="has config.json but no weights"):
        load(tmp_path)


def test_task_the_checkpoint_does_not_hold(checkpoint):
    with pytest.raises(LoadError, match="holds a 'pretraining' model, which does not contain task='discriminator'"):
        load(checkpoint, task="discriminator")
    with pytest.raises(LoadError, match="fill_mask needs a masked-LM head"):
        load(checkpoint, task="backbone").fill_mask("a [MASK] b")


def test_electra_halves_from_different_runs_are_refused(tmp_path):
    electra = dict(SIZES, embedding_size=16)
    transformers.ElectraForPreTraining(transformers.ElectraConfig(**electra)).save_pretrained(
        tmp_path / "pair" / "discriminator")
    transformers.ElectraForMaskedLM(transformers.ElectraConfig(**dict(electra, hidden_size=16))).save_pretrained(
        tmp_path / "pair" / "generator")
    with pytest.raises(ConversionError, match="embeddings differ .*word_embeddings"):
        load(tmp_path / "pair")


def test_failed_export_leaves_nothing_and_existing_output_is_kept(checkpoint, tmp_path):
    config = config_lib.model_config("bert", **SIZES, embedding_size=16)
    unexportable = Pretrained(config=config, task="backbone", params={})
    with pytest.raises(ConversionError, match="embedding_size=16 must equal hidden_size=32"):
        bert_jax.save_pretrained(unexportable, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert"]
    with pytest.raises(FileExistsError, match="not empty"):
        bert_jax.save_pretrained(load(checkpoint), checkpoint)
