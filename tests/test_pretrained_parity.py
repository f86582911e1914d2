"""load_pretrained reads random-weight HF directories of every family with transformers' outputs; save_pretrained's HF
export loads in transformers with identical outputs; bert_jax -> HF -> bert_jax and the bert_jax format are exact."""
import warnings

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import linen as nn
from test_modeling_parity import COMMON, assert_close, batch, randomize, torch_outputs
from train_helpers import as_users_compile

import bert_jax
from bert_jax import config_lib, modeling, sharding
from bert_jax.modeling.transformer import pad_vocab, to_unscanned_layout, unpad_vocab

EAGER = dict(attn_implementation="eager")
GENERATOR_SIZES = dict(hidden_size=48, num_attention_heads=3, intermediate_size=96)
# case: (transformers class, its config, {bert_jax output: transformers output}, task load_pretrained reports)
CASES = {
    "bert": (transformers.BertForPreTraining, transformers.BertConfig(**COMMON, **EAGER),
             {"mlm_logits": "prediction_logits", "sentence_logits": "seq_relationship_logits"}, "pretraining"),
    "roberta": (transformers.RobertaForMaskedLM,
                transformers.RobertaConfig(**COMMON, type_vocab_size=1, pad_token_id=1, **EAGER),
                {"mlm_logits": "logits"}, "masked_lm"),
    "albert": (transformers.AlbertForPreTraining,
               transformers.AlbertConfig(**COMMON, embedding_size=32, num_hidden_groups=1, **EAGER),
               {"mlm_logits": "prediction_logits", "sentence_logits": "sop_logits"}, "pretraining"),
    "electra_discriminator": (transformers.ElectraForPreTraining,
                              transformers.ElectraConfig(**COMMON, embedding_size=32, **EAGER),
                              {"discriminator_logits": "logits"}, "discriminator"),
    "electra_generator": (transformers.ElectraForMaskedLM,
                          transformers.ElectraConfig(**{**COMMON, **GENERATOR_SIZES}, embedding_size=32, **EAGER),
                          {"mlm_logits": "logits"}, "generator"),
}


def inputs_for(pad_token_id, type_vocab_size):
    inputs = batch(pad_token_id=pad_token_id)
    if type_vocab_size == 1:
        inputs["token_type_ids"] = np.zeros_like(inputs["input_ids"])
    return inputs


def assert_outputs_match(loaded, reference, outputs, inputs):
    """Hidden states through .encode, head logits through .model; per-token outputs compared on real tokens."""
    mask = inputs["attention_mask"]
    assert_close(loaded.encode(**inputs)["last_hidden_state"], reference.hidden_states[-1], mask)
    ours = as_users_compile(jax.jit(loaded.model.apply), {"params": loaded.params},
                            **{k: v.astype(np.int32) for k, v in inputs.items()})
    for key, attribute in outputs.items():
        per_token = ours[key].shape[:2] == mask.shape
        assert_close(ours[key], getattr(reference, attribute), mask if per_token else None)


@pytest.mark.parametrize("case", CASES)
def test_hf_directory_loads_and_exports_with_transformers_outputs(case, tmp_path):
    hf_class, hf_config, outputs, task = CASES[case]
    hf = randomize(hf_class(hf_config))
    hf.save_pretrained(tmp_path / "hf")
    inputs = inputs_for(hf_config.pad_token_id, hf_config.type_vocab_size)
    reference = torch_outputs(hf, inputs)

    with pytest.warns(UserWarning, match="no tokenizer files"):
        loaded = bert_jax.load_pretrained(tmp_path / "hf")
    assert loaded.head == task and loaded.tokenizer is None
    assert all(leaf.devices() == {jax.devices("cpu")[0]} for leaf in jax.tree.leaves(loaded.params))
    assert_outputs_match(loaded, reference, outputs, inputs)

    bert_jax.save_pretrained(loaded, tmp_path / "export", format="hf")
    exported, info = hf_class.from_pretrained(tmp_path / "export", output_loading_info=True, **EAGER)
    assert not any(info.values()), info
    again = torch_outputs(exported.eval(), inputs)
    for attribute in outputs.values():
        np.testing.assert_array_equal(getattr(again, attribute), getattr(reference, attribute))
    np.testing.assert_array_equal(again.hidden_states[-1], reference.hidden_states[-1])


def test_backbone_of_a_sharded_checkpoint_onto_a_mesh(tmp_path):
    """A checkpoint split over several safetensors files, loaded as its encoder only, sharded over 8 devices."""
    hf_class, hf_config, _, _ = CASES["bert"]
    hf = randomize(hf_class(hf_config))
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    inputs = inputs_for(hf_config.pad_token_id, hf_config.type_vocab_size)
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backbone = bert_jax.load_pretrained(tmp_path, head="backbone", mesh=mesh)
    assert backbone.head == "backbone" and set(backbone.params) == {"embeddings", "encoder", "pooler"}
    intermediate = backbone.params["encoder"]["layer_0"]["intermediate"]["kernel"]
    assert intermediate.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    encoded = backbone.encode(**inputs)
    reference = torch_outputs(hf, inputs)
    assert_close(encoded["last_hidden_state"], reference.hidden_states[-1], inputs["attention_mask"])
    assert_close(encoded["pooler_output"], hf.bert.pooler(reference.hidden_states[-1]))


def test_pytorch_model_bin_loads_like_safetensors(tmp_path):
    hf_class, hf_config, outputs, _ = CASES["roberta"]
    hf = randomize(hf_class(hf_config))
    hf.config.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    inputs = inputs_for(hf_config.pad_token_id, hf_config.type_vocab_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = bert_jax.load_pretrained(tmp_path)
    assert_outputs_match(loaded, torch_outputs(hf, inputs), outputs, inputs)


def random_params(model, seed=0):
    """Every parameter random, so an exact round trip cannot pass on zeros and ones; but the vocabulary padding
    rows zero, as the model keeps them (exports drop them, imports pad them with zeros)."""
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32),
                          nn.unbox(modeling.abstract_params(model)))
    return pad_vocab(unpad_vocab(params, model.config), model.config)


ROUND_TRIPS = {
    "bert_scanned": (config_lib.model_config("bert", **COMMON, scan_layers=True), "pretraining"),
    "roberta": (config_lib.model_config("roberta", **COMMON, type_vocab_size=1, pad_token_id=1, pooler=False),
                "masked_lm"),
    "albert": (config_lib.model_config("albert", **COMMON, embedding_size=32, num_hidden_groups=1), "pretraining"),
    "electra_both": (config_lib.model_config("electra", **COMMON, embedding_size=32, pooler=False,
                                             generator=dict(GENERATOR_SIZES, num_hidden_layers=3)), "both"),
}


@pytest.mark.parametrize("case", ROUND_TRIPS)
def test_bert_jax_to_hf_to_bert_jax_is_exact(case, tmp_path):
    config, task = ROUND_TRIPS[case]
    original = bert_jax.Pretrained(config=config, head=task, params=None)
    original.params = random_params(original.model)
    bert_jax.save_pretrained(original, tmp_path / "hf", format="hf")
    bert_jax.save_pretrained(original, tmp_path / "ours", format="bert_jax")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_hf = bert_jax.load_pretrained(tmp_path / "hf")
        from_ours = bert_jax.load_pretrained(tmp_path / "ours")
    assert from_hf.head == from_ours.head == task
    assert from_ours.config == config
    jax.tree.map(np.testing.assert_array_equal, to_unscanned_layout(original.params), from_hf.params)
    jax.tree.map(np.testing.assert_array_equal, original.params, from_ours.params)
    inputs = inputs_for(config.pad_token_id, config.type_vocab_size)
    np.testing.assert_allclose(from_hf.encode(**inputs)["last_hidden_state"],
                               from_ours.encode(**inputs)["last_hidden_state"], atol=1e-5)
