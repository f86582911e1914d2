"""Execution switches change how a model runs, never what it computes (beyond bfloat16 rounding)."""
import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax.ad_checkpoint import print_saved_residuals
from jax.sharding import PartitionSpec

from bert_jax import config_lib, families, flops, modeling, sharding
from bert_jax.modeling import transformer
from bert_jax.modeling.transformer import LAYER_NORM_STATISTICS, to_model_layout, to_unscanned_layout


def tiny(family="bert", **model_overrides):
    config = config_lib.load_preset(family, "tiny")
    config.model.update(model_overrides)
    return config


def inputs():
    ids = jax.random.randint(jax.random.key(1), (2, 16), 5, 1000)
    mask = jnp.ones_like(ids).at[1, 10:].set(0)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=jnp.zeros_like(ids).at[:, 8:].set(1))


def run(config, params, **kwargs):
    """The model's outputs, compiled as one program (op by op, a remat or scan compiles hundreds of small ones)."""
    model = modeling.pretraining_model(config)
    return jax.jit(lambda params: model.apply({"params": params}, **inputs(), **kwargs))(params)


@pytest.mark.parametrize("policy", ["full", "dots", "dots_with_no_batch_dims"])
def test_remat_policies_give_identical_loss_and_gradients(policy):
    base = tiny()
    params = modeling.init_params(modeling.pretraining_model(base), jax.random.key(0))

    def loss(p, config):
        return jnp.mean(run(config, p)["mlm_logits"] ** 2)

    loss_and_grad = lambda config: jax.jit(jax.value_and_grad(lambda p: loss(p, config)))(params)
    ref_loss, ref_grad = loss_and_grad(base)
    remat_loss, remat_grad = loss_and_grad(tiny(remat_policy=policy))
    np.testing.assert_allclose(remat_loss, ref_loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), remat_grad, ref_grad)


@pytest.mark.parametrize("family", ["bert", "albert", "electra"])
def test_scan_over_layers_matches_the_loop(family):
    looped = tiny(family)
    scanned = tiny(family, scan_layers=True, remat_policy="dots")
    params = modeling.init_params(modeling.pretraining_model(looped), jax.random.key(0))
    stacked = to_model_layout(params, scanned.model)
    if family != "albert":  # ALBERT's one shared layer is broadcast, not stacked
        assert jax.tree.structure(stacked) != jax.tree.structure(params)
    assert jax.tree.structure(stacked) == jax.tree.structure(
        modeling.init_params(modeling.pretraining_model(scanned), jax.random.key(0)))
    jax.tree.map(np.testing.assert_array_equal, to_unscanned_layout(stacked), params)
    np.testing.assert_allclose(run(scanned, stacked)["mlm_logits"], run(looped, params)["mlm_logits"], atol=1e-5)


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_scanned_layers_without_remat_give_the_loops_gradients(family):
    """Scanned without remat, a layer keeps only its named activations (transformer.SCANNED_SAVES) and recomputes
    the rest in the backward pass: the loss and gradients stay the unscanned loop's."""
    looped = tiny(family)
    scanned = tiny(family, scan_layers=True)
    params = modeling.init_params(modeling.pretraining_model(looped), jax.random.key(0))

    def loss_and_grad(config, p):
        return jax.jit(jax.value_and_grad(lambda p: jnp.mean(run(config, p)["mlm_logits"] ** 2)))(p)

    ref_loss, ref_grad = loss_and_grad(looped, params)
    scan_loss, scan_grad = loss_and_grad(scanned, to_model_layout(params, scanned.model))
    np.testing.assert_allclose(scan_loss, ref_loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), to_unscanned_layout(scan_grad), ref_grad)


def test_scanned_layers_stack_only_the_named_activations_and_statistics(capsys):
    """Scanned without remat, the loop stacks a layer's Q, K and V, its FFN's pre-activation, the two sums before
    its LayerNorms (one of them the carry, transformer.PendingNorm) and each LayerNorm's float32 mean and 1/std
    (LAYER_NORM_STATISTICS), so that its backward pass neither reduces the LayerNorms' inputs again nor keeps the
    output LayerNorm's input beside the carry; the rest is recomputed."""
    config = tiny(scan_layers=True, num_hidden_layers=3, num_hidden_groups=3)  # no other residual starts f32[3,
    params = modeling.init_params(modeling.pretraining_model(config), jax.random.key(0))
    print_saved_residuals(lambda p: jnp.mean(run(config, p)["mlm_logits"] ** 2), params)
    layers, (rows, seq) = config.model.num_hidden_layers, inputs()["input_ids"].shape
    hidden, ffn = config.model.hidden_size, config.model.intermediate_size
    stacks = collections.Counter(line.split(" ")[0] for line in capsys.readouterr().out.splitlines()
                                 if line.startswith(f"f32[{layers},") and "from the argument" not in line)
    assert stacks == {
        f"f32[{layers},{rows},{seq},1]": 2 * len(LAYER_NORM_STATISTICS),  # the attention's and the FFN's LayerNorm
        f"f32[{layers},{rows},{seq},{hidden}]": 2,  # the sums before the attention's and the output LayerNorm
        f"f32[{layers},3,{rows},{seq},{hidden}]": 1,  # Q, K and V
        f"f32[{layers},{rows},{seq},{ffn}]": 1,  # the FFN's pre-activation
        f"f32[{layers},{hidden}]": 2,  # the output LayerNorm's scale and bias, carried to the next layer
    }, stacks


@pytest.mark.parametrize("family,overrides,row_multiple", [
    ("bert", {}, 16), ("albert", {}, 1), ("electra", {}, 1), ("roberta", {"remat_policy": "dots"}, 1),
    ("bert", {"scan_layers": True}, 1), ("albert", {"scan_layers": True}, 1), ("modernbert", {}, 1)])
def test_masked_positions_give_the_full_models_outputs_and_gradients_there(family, overrides, row_multiple,
                                                                           monkeypatch):
    """Given masked_positions the last layer computes only those rows and [CLS] where it can
    (transformer.last_layer_at_rows: unscanned, or after a scanned loop a layer short; ModernBERT gathers after),
    padded as on a GPU with row_multiple 16 (transformer.row_positions): the MLM logits, the sentence logits and
    every gradient equal the full model's at those positions, over padding, packed rows and a repeated position."""
    monkeypatch.setitem(transformer.ROW_MULTIPLES, "cpu", row_multiple)
    config = tiny(family, **overrides)
    batch = inputs()
    positions = jnp.array([[0, 3, 9, 9], [2, 7, 11, 15]])  # row 1 pads from 10 on: a masked position can be padding
    if family != "electra":  # Electra's __call__ (init's) takes no packed rows; its generator's rows are the same code
        batch["packing_segment_ids"] = jnp.array([[1] * 6 + [2] * 10, [1] * 9 + [2] * 7])
    model = modeling.pretraining_model(config)
    params = modeling.init_params(model, jax.random.key(0))
    at_rows = lambda p: model.apply({"params": p}, **batch, masked_positions=positions)
    gathered = lambda outputs: {**outputs, "mlm_logits": jnp.take_along_axis(outputs["mlm_logits"],
                                                                             positions[..., None], axis=1)}
    full = lambda p: gathered(model.apply({"params": p}, **batch))

    def loss_and_logits(outputs):
        loss = jnp.mean(outputs["mlm_logits"][..., :50] ** 2) + jnp.mean(outputs.get("sentence_logits", 0.0) ** 2)
        return loss, outputs["mlm_logits"]

    value_and_grad = lambda forward: jax.jit(jax.value_and_grad(lambda p: loss_and_logits(forward(p)), has_aux=True))
    (rows_loss, rows_logits), rows_grad = value_and_grad(at_rows)(params)
    (full_loss, full_logits), full_grad = value_and_grad(full)(params)
    assert rows_logits.shape[:2] == positions.shape
    np.testing.assert_allclose(rows_logits, full_logits, atol=2e-6)
    np.testing.assert_allclose(rows_loss, full_loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), rows_grad, full_grad)


@pytest.mark.parametrize("family", ["bert", "electra"])
def test_a_classifier_reads_cls_from_a_last_layer_that_computes_it_alone(family):
    """SequenceClassifier's logits equal its head applied to the full backbone's [CLS] (the pooler's, or ELECTRA's
    dense + GELU), though its last layer computes that row alone."""
    config = tiny(family).model
    classifier = modeling.SequenceClassifier(config, num_labels=3)
    batch = inputs()
    params = modeling.init_params(classifier, jax.random.key(0), **batch)
    logits = jax.jit(lambda p: classifier.apply({"params": p}, **batch)["logits"])(params)
    full = jax.jit(lambda p: modeling.backbone(config).apply({"params": p["backbone"]}, **batch))(params)
    dense = lambda x, layer: x @ params[layer]["kernel"] + params[layer]["bias"]
    features = full["pooler_output"] if config.pooler else jax.nn.gelu(
        dense(full["last_hidden_state"][:, 0], "dense"), approximate=False)
    np.testing.assert_allclose(logits, dense(features, "classifier"), atol=2e-6)


def test_the_model_flops_follow_the_last_layer_at_the_read_rows():
    """flops.encoder_forward_flops with read_rows saves what the compiled forward pass saves (XLA's own count, which
    also has the elementwise work: within 2%), where the model computes its last layer at those rows. Scanned, the
    FFN runs at those rows too (XLA counts a loop's body once, so its shapes tell, not its count)."""
    model_config = tiny(hidden_size=256, intermediate_size=1024, num_hidden_layers=2).model
    seq, read = 128, 21  # 20 positions and [CLS]
    ids = jnp.ones((1, seq), jnp.int32)

    def compiled(**kwargs):
        encoder = modeling.EncoderModel(model_config)
        params = modeling.init_params(encoder, jax.random.key(0), input_ids=ids)
        forward = jax.jit(lambda p: encoder.apply({"params": p}, ids, **kwargs)["last_hidden_state"].sum())
        return forward.lower(params).compile()

    at_rows = {"output_positions": 3 * jnp.arange(read - 1)[None]}
    saved = compiled().cost_analysis()["flops"] - compiled(**at_rows).cost_analysis()["flops"]
    counted = flops.encoder_forward_flops(model_config, seq) - flops.encoder_forward_flops(model_config, seq, read)
    assert counted > 0 and abs(saved - counted) <= 0.02 * counted, (saved, counted)
    model_config.scan_layers = True
    assert f"f32[1,{read},1024]" in compiled(**at_rows).as_text()


def test_bfloat16_compute_keeps_float32_params_and_stays_close():
    config32, config16 = tiny(), tiny(dtype="bfloat16")
    params = modeling.init_params(modeling.pretraining_model(config16), jax.random.key(0))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    out16, out32 = run(config16, params), run(config32, params)
    assert out16["last_hidden_state"].dtype == jnp.bfloat16
    assert out16["mlm_logits"].dtype == jnp.float32
    np.testing.assert_allclose(out16["mlm_logits"], out32["mlm_logits"], atol=0.1)


def test_dropout_is_active_only_when_not_deterministic():
    config = tiny()
    params = modeling.init_params(modeling.pretraining_model(config), jax.random.key(0))
    train = lambda seed: run(config, params, deterministic=False, rngs={"dropout": jax.random.key(seed)})
    assert not np.allclose(train(0)["mlm_logits"], train(1)["mlm_logits"])
    np.testing.assert_array_equal(run(config, params)["mlm_logits"], run(config, params)["mlm_logits"])


def test_packed_examples_do_not_attend_to_each_other():
    config = tiny()
    model = modeling.pretraining_model(config)
    params = modeling.init_params(model, jax.random.key(0))
    ids = jax.random.randint(jax.random.key(2), (1, 16), 5, 1000)
    segments = jnp.array([[1] * 9 + [2] * 7])
    packed = model.apply({"params": params}, ids, packing_segment_ids=segments)["last_hidden_state"]
    alone = model.apply({"params": params}, ids[:, :9])["last_hidden_state"]
    np.testing.assert_allclose(packed[:, :9], alone, atol=1e-5)


@pytest.mark.parametrize("family", families.names())
def test_every_parameter_names_one_logical_axis_per_dimension(family):
    config = tiny(family, scan_layers=families.get(family).scans_layers)
    boxed = modeling.abstract_params(modeling.pretraining_model(config))
    known = {name for name, _ in sharding.LOGICAL_AXIS_RULES}
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert leaves and all(isinstance(leaf, nn.LogicallyPartitioned) for leaf in leaves)
    for leaf in leaves:
        assert len(leaf.names) == leaf.value.ndim and set(leaf.names) - {None} <= known, leaf  # None: replicated


def test_rules_shard_parameters_over_the_mesh():
    mesh = sharding.make_mesh(2, 2, 2)
    boxed = modeling.abstract_params(modeling.pretraining_model(tiny()))
    shardings = sharding.mesh_shardings(boxed, mesh)
    layer = shardings["backbone"]["encoder"]["layer_0"]
    assert layer["intermediate"]["kernel"].spec == PartitionSpec("fsdp", "tensor")
    assert layer["query"]["kernel"].spec == PartitionSpec("fsdp", "tensor", None)
    assert shardings["backbone"]["embeddings"]["word_embeddings"]["embedding"].spec == PartitionSpec("tensor", "fsdp")


@pytest.mark.parametrize("shape", [(3, 1, 1), (-1, 3, 1), (2, -1, -1)])
def test_impossible_mesh_shapes_are_explained(shape):
    with pytest.raises(sharding.MeshError, match="config.mesh"):
        sharding.make_mesh(*shape)
