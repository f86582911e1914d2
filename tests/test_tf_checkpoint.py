"""Original TF1 checkpoints (google-research bert, albert, electra) written with a tf.compat.v1 Saver under the
original variable names, from a random transformers model's weights, load with that model's outputs."""
import json
import warnings

import numpy as np
import pytest
import tensorflow as tf
import transformers
from test_modeling_parity import assert_close, batch, randomize, torch_outputs
from test_pretrained_parity import assert_outputs_match

import bert_jax
from bert_jax import families, state_dict

SIZES = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=64, attn_implementation="eager")
# The original code's gelu is the tanh approximation, which HF calls gelu_new; its config files say "gelu".
TF_GELU = dict(hidden_act="gelu_new")


def linear(hf, tf_scope, kernel="kernel"):
    return {f"{hf}.weight": f"{tf_scope}/{kernel}", f"{hf}.bias": f"{tf_scope}/bias"}


def norm(hf, tf_scope):
    return {f"{hf}.weight": f"{tf_scope}/gamma", f"{hf}.bias": f"{tf_scope}/beta"}


def embeddings(hf_base, tf_base):
    names = {f"{hf_base}.embeddings.{n}_embeddings.weight": f"{tf_base}/embeddings/{n}_embeddings"
             for n in ("word", "position", "token_type")}
    return names | norm(f"{hf_base}.embeddings.LayerNorm", f"{tf_base}/embeddings/LayerNorm")


def bert_layer(hf, tf_scope):
    """One layer of google-research/bert's (and electra's) transformer_model, spelled as its variable scopes."""
    names = {}
    for hf_module, tf_module in (("attention.self.query", "attention/self/query"),
                                 ("attention.self.key", "attention/self/key"),
                                 ("attention.self.value", "attention/self/value"),
                                 ("attention.output.dense", "attention/output/dense"),
                                 ("intermediate.dense", "intermediate/dense"), ("output.dense", "output/dense")):
        names |= linear(f"{hf}.{hf_module}", f"{tf_scope}/{tf_module}")
    return (names | norm(f"{hf}.attention.output.LayerNorm", f"{tf_scope}/attention/output/LayerNorm")
            | norm(f"{hf}.output.LayerNorm", f"{tf_scope}/output/LayerNorm"))


def bert_names(layers):
    """HF name -> google-research/bert name, for BertForPreTraining."""
    names = embeddings("bert", "bert") | linear("bert.pooler.dense", "bert/pooler/dense")
    for i in range(layers):
        names |= bert_layer(f"bert.encoder.layer.{i}", f"bert/encoder/layer_{i}")
    return (names | linear("cls.predictions.transform.dense", "cls/predictions/transform/dense")
            | norm("cls.predictions.transform.LayerNorm", "cls/predictions/transform/LayerNorm")
            | {"cls.predictions.bias": "cls/predictions/output_bias"}
            | linear("cls.seq_relationship", "cls/seq_relationship", kernel="output_weights")
            | {"cls.seq_relationship.bias": "cls/seq_relationship/output_bias"})


def albert_names(groups):
    """HF name -> google-research/albert (v2) name, for AlbertForPreTraining."""
    names = (embeddings("albert", "bert") | linear("albert.pooler", "bert/pooler/dense")
             | linear("albert.encoder.embedding_hidden_mapping_in", "bert/encoder/embedding_hidden_mapping_in"))
    for g in range(groups):
        hf, tf_scope = f"albert.encoder.albert_layer_groups.{g}.albert_layers.0", \
            f"bert/encoder/transformer/group_{g}/inner_group_0"
        for hf_module, tf_module in (("attention.query", "attention_1/self/query"),
                                     ("attention.key", "attention_1/self/key"),
                                     ("attention.value", "attention_1/self/value"),
                                     ("attention.dense", "attention_1/output/dense"),
                                     ("ffn", "ffn_1/intermediate/dense"),
                                     ("ffn_output", "ffn_1/intermediate/output/dense")):
            names |= linear(f"{hf}.{hf_module}", f"{tf_scope}/{tf_module}")
        names |= norm(f"{hf}.attention.LayerNorm", f"{tf_scope}/LayerNorm")
        names |= norm(f"{hf}.full_layer_layer_norm", f"{tf_scope}/LayerNorm_1")
    return (names | linear("predictions.dense", "cls/predictions/transform/dense")
            | norm("predictions.LayerNorm", "cls/predictions/transform/LayerNorm")
            | {"predictions.bias": "cls/predictions/output_bias"}
            | linear("sop_classifier.classifier", "cls/seq_relationship", kernel="output_weights")
            | {"sop_classifier.classifier.bias": "cls/seq_relationship/output_bias"})


def electra_names(layers, scope):
    """HF name -> google-research/electra name: the discriminator under electra/, the generator under generator/
    (both ElectraFor* models name their encoder electra.*; the embeddings are electra/'s, shared)."""
    names = embeddings("electra", "electra") | linear("electra.embeddings_project", f"{scope}/embeddings_project")
    for i in range(layers):
        names |= bert_layer(f"electra.encoder.layer.{i}", f"{scope}/encoder/layer_{i}")
    if scope == "electra":
        return (names | linear("discriminator_predictions.dense", "discriminator_predictions/dense")
                | linear("discriminator_predictions.dense_prediction", "discriminator_predictions/dense_1"))
    return (names | linear("generator_predictions.dense", "generator_predictions/dense")
            | norm("generator_predictions.LayerNorm", "generator_predictions/LayerNorm")
            | {"generator_lm_head.bias": "generator_predictions/output_bias"})


def tf_arrays(torch_model, names):
    """The torch weights under their TF names; TF kernels are [in, out]."""
    weights = {k: v.numpy() for k, v in torch_model.state_dict().items()}
    return {tf_name: weights[hf].T if tf_name.endswith("/kernel") else weights[hf] for hf, tf_name in names.items()}


def write_tf_checkpoint(directory, arrays):
    """What the original run_pretraining.py leaves: weights, Adam slots and global_step, via a v1 Saver."""
    arrays = dict(arrays, global_step=np.int64(1000))
    arrays |= {f"{name}/adam_m": np.zeros_like(value) for name, value in list(arrays.items())[:3]}
    with tf.Graph().as_default():
        variables = {name: tf.compat.v1.Variable(value) for name, value in arrays.items()}
        saver = tf.compat.v1.train.Saver(var_list=variables)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(directory / "model.ckpt"), global_step=1000)


def load_quietly(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no vocab in these directories
        return bert_jax.load_pretrained(path, **kwargs)


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_original_bert_and_albert_checkpoints(family, tmp_path):
    if family == "bert":
        hf = randomize(transformers.BertForPreTraining(transformers.BertConfig(**SIZES, **TF_GELU)))
        names, outputs = bert_names(SIZES["num_hidden_layers"]), {"mlm_logits": "prediction_logits",
                                                                  "sentence_logits": "seq_relationship_logits"}
    else:
        hf = randomize(transformers.AlbertForPreTraining(transformers.AlbertConfig(
            **SIZES, **TF_GELU, embedding_size=32, num_hidden_groups=1)))
        names, outputs = albert_names(1), {"mlm_logits": "prediction_logits", "sentence_logits": "sop_logits"}
    write_tf_checkpoint(tmp_path, tf_arrays(hf, names))
    config = {k: v for k, v in hf.config.to_dict().items() if k in state_dict.HF_CONFIG_KEYS}
    (tmp_path / families.get(family).tf1.config_file).write_text(json.dumps({**config, "hidden_act": "gelu"}))

    loaded = load_quietly(tmp_path if family == "bert" else tmp_path / "model.ckpt-1000")  # a directory or a prefix
    assert (loaded.config.family, loaded.head, loaded.config.hidden_act) == (family, "pretraining", "gelu_new")
    inputs = batch()
    assert_outputs_match(loaded, torch_outputs(hf, inputs), outputs, inputs)


def test_original_electra_checkpoint_holds_generator_and_discriminator(tmp_path):
    electra = dict(SIZES, hidden_size=128, num_attention_heads=2, intermediate_size=256, embedding_size=32, **TF_GELU)
    discriminator = randomize(transformers.ElectraForPreTraining(transformers.ElectraConfig(**electra)))
    generator = randomize(transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        **dict(electra, hidden_size=64, num_attention_heads=1, intermediate_size=128))), seed=1)
    generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())
    layers = SIZES["num_hidden_layers"]
    write_tf_checkpoint(tmp_path, tf_arrays(discriminator, electra_names(layers, "electra"))
                        | tf_arrays(generator, electra_names(layers, "generator")))
    inputs = batch()

    both = load_quietly(tmp_path)
    assert both.head == "both" and both.config.generator.hidden_size == 64
    reference = torch_outputs(generator, inputs)
    logits = both.model.apply({"params": both.params}, **{k: v.astype(np.int32) for k, v in inputs.items()},
                              method="generator_logits")
    assert_close(logits, reference.logits, inputs["attention_mask"])

    for head, torch_model, outputs in (("discriminator", discriminator, {"discriminator_logits": "logits"}),
                                       ("generator", generator, {"mlm_logits": "logits"})):
        part = load_quietly(tmp_path, head=head)
        assert part.head == head
        assert_outputs_match(part, torch_outputs(torch_model, inputs), outputs, inputs)


def test_unknown_variables_and_missing_config_are_named(tmp_path):
    write_tf_checkpoint(tmp_path, {"bert/encoder/layer_0/attention/self/query/kernel": np.zeros((4, 4), np.float32)})
    with pytest.raises(state_dict.ConversionError, match="bert_config.json not found"):
        load_quietly(tmp_path)
    (tmp_path / "other").mkdir()
    write_tf_checkpoint(tmp_path / "other", {"transformer/h0/kernel": np.zeros((4, 4), np.float32)})
    with pytest.raises(state_dict.ConversionError, match="cannot tell which model.*transformer/h0/kernel"):
        load_quietly(tmp_path / "other")
