"""A checkpoint that does not fit the model gets an error listing the tensors; nothing is half-loaded."""
import numpy as np
import pytest
import transformers

from bert_jax import config_lib, state_dict

SIZES = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=32)


def torch_state(model) -> dict:
    return {k: v.numpy() for k, v in model.state_dict().items()}


def test_checkpoint_of_another_family_is_named():
    bert = torch_state(transformers.BertForPreTraining(transformers.BertConfig(**SIZES)))
    albert_config = config_lib.model_config("albert", **SIZES, embedding_size=16, num_hidden_groups=1)
    with pytest.raises(state_dict.ConversionError, match="this is a bert checkpoint.*family='albert'"):
        state_dict.params_from_hf(bert, albert_config, "pretraining")


def test_missing_and_unexpected_tensors_are_listed():
    sd = torch_state(transformers.BertForPreTraining(transformers.BertConfig(**SIZES)))
    config = state_dict.config_from_hf(transformers.BertConfig(**SIZES).to_dict())
    del sd["bert.encoder.layer.1.output.dense.weight"]
    sd["bert.encoder.layer.7.extra"] = np.zeros(3, np.float32)
    with pytest.raises(state_dict.ConversionError) as error:
        state_dict.params_from_hf(sd, config, "pretraining")
    assert "missing tensors: bert.encoder.layer.1.output.dense.weight" in str(error.value)
    assert "unexpected tensors: bert.encoder.layer.7.extra" in str(error.value)


def test_config_with_other_sizes_reports_the_mismatched_shapes():
    sd = torch_state(transformers.BertModel(transformers.BertConfig(**SIZES)))
    config = state_dict.config_from_hf(transformers.BertConfig(**SIZES).to_dict())
    config.intermediate_size = 48
    with pytest.raises(state_dict.ConversionError, match="layer_0/intermediate/kernel: checkpoint .32, 64. vs model "
                                                         ".32, 48."):
        state_dict.params_from_hf(sd, config, "backbone")


def test_unknown_head_for_family_lists_choices():
    config = state_dict.config_from_hf(transformers.RobertaConfig(**SIZES).to_dict())
    with pytest.raises(state_dict.ConversionError, match="roberta has no 'pretraining' head"):
        state_dict.params_from_hf({"roberta.x": np.zeros(1)}, config, "pretraining")


def test_export_is_the_inverse_of_import():
    hf = transformers.AlbertForPreTraining(transformers.AlbertConfig(**SIZES, embedding_size=16))
    sd = torch_state(hf)
    config = state_dict.config_from_hf(hf.config.to_dict())
    exported = state_dict.params_to_hf(state_dict.params_from_hf(sd, config, "pretraining"), config, "pretraining")
    assert set(exported) == {k for k in sd if not k.endswith(state_dict.DERIVED_SUFFIXES)}
    for name, array in exported.items():
        np.testing.assert_array_equal(array, sd[name], err_msg=name)
