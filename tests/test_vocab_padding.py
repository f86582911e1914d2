"""The vocabulary is padded to a multiple of 384 inside the model (so that it splits over the tensor mesh axis) and
nowhere else: padded columns are never predicted, exports and counts have the real vocabulary, and workdirs saved
before the padding still load."""
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import safetensors.numpy
import transformers
from flax import linen as nn
from test_modeling_parity import assert_close, randomize, torch_outputs

import bert_jax
from bert_jax import config_lib, modeling, sharding
from bert_jax.modeling.models import MASKED_LOGIT
from bert_jax.modeling.transformer import VOCAB_PARAMS, padded_vocab_size, unpad_vocab
from bert_jax.objectives import mlm, rtd

VOCAB = 300  # padded to 384
SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=32)


def bert_config(**overrides):
    return config_lib.model_config("bert", **{**SIZES, **overrides})


def init(model):
    return nn.unbox(jax.jit(model.init)(jax.random.key(0), **modeling.dummy_inputs())["params"])


def words(params):
    return params["backbone"]["embeddings"]["word_embeddings"]["embedding"]


def test_padded_vocab_size_rounds_up_to_384():
    assert [padded_vocab_size(bert_config(vocab_size=v)) for v in (128, 300, 30000, 30522)] == [384, 384, 30336,
                                                                                              30720]


@pytest.mark.parametrize("model", ["pretraining", "electra"])
def test_only_the_vocabulary_parameters_are_padded(model):
    """VOCAB_PARAMS (what padding, exports and counts act on) are exactly the parameters with a "vocab" axis."""
    config = bert_config() if model == "pretraining" else config_lib.model_config(
        "electra", **SIZES, embedding_size=16, pooler=False,
        generator=dict(hidden_size=16, num_attention_heads=2, intermediate_size=32, num_hidden_layers=2))
    module = modeling.PreTrainingModel(config) if model == "pretraining" else modeling.Electra(config)
    boxed = modeling.abstract_params(module)
    flat = {path: leaf for path, leaf in jax.tree_util.tree_flatten_with_path(
        boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]}
    vocab_axis = {tuple(k.key for k in path)[-2:] for path, leaf in flat.items() if "vocab" in leaf.names}
    assert vocab_axis and vocab_axis <= set(VOCAB_PARAMS)
    for path, leaf in flat.items():
        assert (leaf.value.shape[0] == 384) == ("vocab" in leaf.names), path
        if "vocab" in leaf.names:
            assert leaf.names[0] == "vocab"


def test_padded_columns_are_never_predicted_and_get_no_gradient():
    config = bert_config()
    model = modeling.PreTrainingModel(config, sentence_head=False)
    params = init(model)
    # The worst case: padding rows that would win every argmax if they were not masked.
    params["backbone"]["embeddings"]["word_embeddings"]["embedding"] = words(params).at[VOCAB:].set(10.0)
    params["mlm_head"]["bias"] = params["mlm_head"]["bias"].at[VOCAB:].set(1e4)
    ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) + 5
    logits = jax.jit(model.apply)({"params": params}, ids)["mlm_logits"]
    assert logits.shape == (2, 8, 384)
    np.testing.assert_array_equal(logits[..., VOCAB:], MASKED_LOGIT)
    assert int(jnp.argmax(logits, -1).max()) < VOCAB
    assert float(jax.nn.softmax(logits, -1)[..., VOCAB:].sum()) == 0.0
    samples = jax.jit(jax.vmap(lambda key: rtd.sample_tokens(logits, key)))(jax.random.split(jax.random.key(1), 64))
    assert int(samples.max()) < VOCAB
    # bfloat16 compute keeps the mask finite and the padding out.
    bf16 = modeling.PreTrainingModel(bert_config(dtype="bfloat16"), sentence_head=False)
    logits16 = jax.jit(bf16.apply)({"params": params}, ids)["mlm_logits"]
    assert bool(jnp.isfinite(logits16).all()) and int(jnp.argmax(logits16, -1).max()) < VOCAB

    batch = {"masked_lm_positions": jnp.array([[1, 2], [3, 4]]), "masked_lm_ids": jnp.array([[7, 8], [9, 299]]),
             "masked_lm_weights": jnp.ones((2, 2))}

    def loss(p):
        outputs = model.apply({"params": p}, ids, masked_positions=batch["masked_lm_positions"])
        return mlm.masked_lm(outputs["mlm_logits"], batch)[0]

    grads = jax.jit(jax.grad(loss))(params)
    assert float(jnp.abs(grads["mlm_head"]["bias"][VOCAB:]).sum()) == 0.0
    assert float(jnp.abs(words(grads)[VOCAB:]).sum()) == 0.0
    assert float(jnp.abs(words(grads)[:VOCAB]).sum()) > 0.0


def test_counts_leave_the_padding_out():
    config = bert_config()
    model = modeling.PreTrainingModel(config)
    params = init(model)
    real = sum(x.size for x in jax.tree.leaves(unpad_vocab(params, config)))
    assert modeling.count_params(params, config) == real == modeling.count_params(
        modeling.abstract_params(model), config)
    assert real == sum(x.size for x in jax.tree.leaves(params)) - (384 - VOCAB) * (32 + 1)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**SIZES))
    assert real == sum(p.numel() for p in hf.parameters())  # tied tensors count once


@pytest.mark.parametrize("case", ["bert", "electra_generator"])
def test_hf_import_pads_and_export_has_exactly_vocab_size_rows(case, tmp_path):
    if case == "bert":
        hf_class, hf_config, output = transformers.BertForPreTraining, transformers.BertConfig, "prediction_logits"
        hf = randomize(hf_class(hf_config(**SIZES, attn_implementation="eager")))
    else:
        hf_class, hf_config, output = transformers.ElectraForMaskedLM, transformers.ElectraConfig, "logits"
        hf = randomize(hf_class(hf_config(**SIZES, embedding_size=16, attn_implementation="eager")))
    hf.save_pretrained(tmp_path / "hf")
    rng = np.random.default_rng(0)
    inputs = {"input_ids": rng.integers(5, VOCAB, size=(2, 12)), "attention_mask": np.ones((2, 12), np.int64),
              "token_type_ids": np.zeros((2, 12), np.int64)}
    reference = torch_outputs(hf, inputs)

    with pytest.warns(UserWarning, match="no tokenizer files"):
        loaded = bert_jax.load_pretrained(tmp_path / "hf")
    assert loaded.config.vocab_size == VOCAB
    assert words(loaded.params).shape[0] == 384 and loaded.params["mlm_head"]["bias"].shape == (384,)
    np.testing.assert_array_equal(words(loaded.params)[VOCAB:], 0.0)
    ours = loaded.model.apply({"params": loaded.params}, **{k: v.astype(np.int32) for k, v in inputs.items()})
    assert ours["mlm_logits"].shape[-1] == 384
    assert_close(ours["mlm_logits"][..., :VOCAB], getattr(reference, output))
    user_logits = loaded._mlm_logits_fn(loaded.params, *(inputs[k].astype(np.int32) for k in
                                                         ("input_ids", "attention_mask", "token_type_ids")))
    assert user_logits.shape == (2, 12, VOCAB)

    bert_jax.save_pretrained(loaded, tmp_path / "export", format="hf")
    tensors = safetensors.numpy.load((tmp_path / "export" / "model.safetensors").read_bytes())
    vocab_rows = {name: t.shape[0] for name, t in tensors.items() if "word_embeddings" in name or name.endswith(
        ("predictions.bias", "lm_head.bias"))}
    assert len(vocab_rows) == 2 and set(vocab_rows.values()) == {VOCAB}, vocab_rows
    exported, info = hf_class.from_pretrained(tmp_path / "export", output_loading_info=True,
                                              attn_implementation="eager")
    assert not any(info.values()), info
    np.testing.assert_array_equal(getattr(torch_outputs(exported.eval(), inputs), output),
                                  getattr(reference, output))


def write_unpadded_workdir(workdir, config):
    """A workdir as the trainer wrote it before the padding: params and optimizer state with vocab_size rows."""
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json())
    shapes = unpad_vocab(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), nn.unbox(
        modeling.abstract_params(modeling.pretraining_model(config)))), config.model)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32), shapes)
    assert words(params).shape == (VOCAB, 32)
    train_state = {"step": np.int32(5), "opt_state": jax.tree.map(np.zeros_like, params)}
    with ocp.CheckpointManager(workdir / "checkpoints") as manager:
        manager.save(5, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                train_state=ocp.args.StandardSave(train_state)))
        manager.wait_until_finished()
    return params


def test_workdir_saved_before_the_padding_loads_and_exports(tmp_path):
    config = config_lib.load_preset("bert", "tiny")
    with config.unlocked():
        config.model.update(SIZES, embedding_size=32)
    saved = write_unpadded_workdir(tmp_path / "old", config)

    loaded = bert_jax.load_pretrained(tmp_path / "old")
    assert words(loaded.params).shape == (384, 32)
    jax.tree.map(np.testing.assert_array_equal, unpad_vocab(loaded.params, loaded.config), saved)
    np.testing.assert_array_equal(words(loaded.params)[VOCAB:], 0.0)

    mesh = sharding.make_mesh(data=2, fsdp=1, tensor=4)
    on_mesh = bert_jax.load_pretrained(tmp_path / "old", head="masked_lm", mesh=mesh)
    assert words(on_mesh.params).sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
    np.testing.assert_array_equal(on_mesh.params["mlm_head"]["bias"][:VOCAB], saved["mlm_head"]["bias"])

    bert_jax.save_pretrained(loaded, tmp_path / "hf", format="hf")
    tensors = safetensors.numpy.load((tmp_path / "hf" / "model.safetensors").read_bytes())
    np.testing.assert_array_equal(tensors["bert.embeddings.word_embeddings.weight"], words(saved))
    np.testing.assert_array_equal(tensors["cls.predictions.bias"], saved["mlm_head"]["bias"])

    bert_jax.save_pretrained(loaded, tmp_path / "new", format="bert_jax")  # today's layout: padded
    again = bert_jax.load_pretrained(tmp_path / "new")
    jax.tree.map(np.testing.assert_array_equal, again.params, loaded.params)


def test_bert_vocabulary_initialises_on_a_tensor_8_mesh():
    """30522 rows do not split 8 ways; 30720 do, so jit(init) with the rules' shardings no longer raises."""
    config = config_lib.model_config("bert", vocab_size=30522, hidden_size=64, num_hidden_layers=1,
                                     num_attention_heads=8, intermediate_size=128, max_position_embeddings=32)
    model = modeling.PreTrainingModel(config)
    mesh = sharding.make_mesh(data=1, fsdp=1, tensor=8)
    inputs = modeling.dummy_inputs(batch_size=2)
    boxed = jax.eval_shape(model.init, jax.random.key(0), **inputs)
    variables = jax.jit(model.init, out_shardings=sharding.mesh_shardings(boxed, mesh))(jax.random.key(0), **inputs)
    table = words(nn.unbox(variables["params"]))
    assert table.shape == (30720, 64) and table.addressable_shards[0].data.shape == (30720 // 8, 64)
    logits = jax.jit(lambda p: model.apply({"params": p}, **inputs)["mlm_logits"])(nn.unbox(variables["params"]))
    assert logits.shape == (2, 8, 30720) and int(jnp.argmax(logits, -1).max()) < 30522
    assert modeling.count_params(variables["params"], config) == modeling.count_params(
        modeling.abstract_params(modeling.PreTrainingModel(config)), config)
