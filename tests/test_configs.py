"""Configs are locked, validated, and every preset builds."""
import pytest

from bert_jax import config_lib, families, modeling


@pytest.mark.parametrize("family", families.names())
def test_every_preset_loads_and_tiny_is_tiny(family):
    sizes = tuple(families.get(family).sizes)
    assert "tiny" in sizes
    tiny = config_lib.load_preset(family, "tiny").model
    assert tiny.hidden_size <= 64 and tiny.num_hidden_layers <= 3  # ModernBERT: one global, two local layers
    for size in sizes:
        config_lib.validate_model_config(config_lib.load_preset(family, size).model,
                                         needs_generator=families.get(family).has_generator)


def test_unknown_key_is_an_error_naming_it():
    config = config_lib.load_preset("bert", "tiny")
    with pytest.raises(AttributeError, match="hiden_size"):
        config.model.hiden_size = 32
    with pytest.raises(AttributeError, match="no_such_key"):
        config.no_such_key = 1


def test_unknown_size_lists_the_valid_ones():
    with pytest.raises(config_lib.ConfigError, match="huge.*tiny"):
        config_lib.load_preset("albert", "huge")


@pytest.mark.parametrize("key,value,match", [
    ("hidden_size", 66, "hidden_size=66.*num_attention_heads"),
    ("num_hidden_groups", 3, "num_hidden_groups=3.*num_hidden_layers=2"),
    ("hidden_act", "swishy", "hidden_act"),
    ("dtype", "float16", "dtype"),
    ("param_dtype", "float16", "param_dtype"),
    ("attention_impl", "flash", "attention_impl"),
    ("remat_policy", "sometimes", "remat_policy"),
])
def test_inconsistent_sizes_name_the_key(key, value, match):
    config = config_lib.load_preset("bert", "tiny")
    config.model[key] = value
    with pytest.raises(config_lib.ConfigError, match=match):
        modeling.pretraining_model(config)


def test_electra_pretraining_needs_a_generator():
    config = config_lib.load_preset("electra", "tiny")
    config.model.generator.hidden_size = 0
    with pytest.raises(config_lib.ConfigError, match="generator.hidden_size"):
        modeling.pretraining_model(config)
