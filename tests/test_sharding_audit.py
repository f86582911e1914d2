"""The compiled train step holds the layout the rules promise, read from its HLO on 8 CPU devices.

A small model with BERT's structure is compiled as the trainer compiles it, for data, FSDP, tensor and mixed meshes:
8 heads so that every mesh below splits them, and a vocabulary of 1000 (padded to 1024) so that the tied word
embeddings hold BERT-base's share of the parameters (21%); XLA on CPU reduces their two gradient contributions
(lookup and MLM projection) separately, which costs data parallelism that share again. From the partitioned module:
(a) every activation keeps the batch split over data x fsdp, (b) the collectives move at most 1.3x the bytes of
the layout's textbook pattern (bert_jax.sharding_audit), (c) the whole state is donated.
"""
import jax
import pytest

from bert_jax import config_lib, sharding, train
from bert_jax import sharding_audit as audit

MESHES = [(8, 1, 1), (1, 8, 1), (1, 1, 8), (2, 2, 2), (1, 2, 4)]
BATCH, SEQ, HIDDEN, FFN = 16, 64, 128, 512


def shape_faithful_config(mesh_shape, family="bert"):
    config = config_lib.load_preset(family, "tiny")
    config.model.update(dict(hidden_size=HIDDEN, num_attention_heads=8, intermediate_size=FFN, num_hidden_layers=2,
                             num_hidden_groups=2, embedding_size=HIDDEN, vocab_size=1000))
    config.data.batch_size, config.data.seq_length = BATCH, SEQ
    config.masking.max_predictions_per_seq = 10
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh_shape
    return config


def compiled_step(config):
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    train.validate(config, mesh)
    program = train.build_program(config, mesh)
    compiled = program.step.lower(program.abstract_state, train.abstract_batch(config, mesh)).compile()
    return mesh, program, compiled.as_text()


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
def test_compiled_step_has_the_textbook_layout(mesh_shape):
    config = shape_faithful_config(mesh_shape)
    mesh, program, hlo = compiled_step(config)
    data, fsdp, tensor = mesh_shape
    local_batch = BATCH // (data * fsdp)

    # (a) The FFN's hidden activation is [B / (data x fsdp), S, FFN / tensor] on each device, and no [B, S, *]
    # array of the whole batch is left when the batch is split.
    shapes = audit.activation_shapes(hlo)
    assert (local_batch, SEQ, FFN // tensor) in shapes
    if local_batch < BATCH:
        assert not [s for s in shapes if s[:2] == (BATCH, SEQ)], sorted(s for s in shapes if s[:2] == (BATCH, SEQ))

    # (b) Collective bytes against the ideal for this layout.
    stats = audit.collective_stats(hlo)
    ideal = audit.ideal_bytes(config, mesh, program.state_shardings["params"], program.abstract_state["params"])
    ratio = audit.total_bytes(stats) / sum(ideal.values())
    assert 0.7 <= ratio <= 1.3, (ratio, stats, ideal)

    # (c) Every buffer of the state is updated in place.
    assert audit.donated_inputs(hlo) == len(jax.tree.leaves(program.abstract_state))


@pytest.mark.parametrize("key, value, message", [
    ("num_attention_heads", 12, "config.model.num_attention_heads=12 does not split over mesh tensor=8"),
    ("intermediate_size", 500, "config.model.intermediate_size=500 does not split over mesh tensor=8"),
])
def test_sizes_that_do_not_split_are_named_before_compiling(key, value, message):
    config = shape_faithful_config((1, 1, 8))
    config.model[key] = value
    if key == "num_attention_heads":
        config.model.hidden_size = 768
    with pytest.raises(sharding.MeshError, match=message):
        train.validate(config, sharding.make_mesh(1, 1, 8))


def test_sequence_parallel_splits_the_residual_stream_over_tensor():
    temp = {}
    for sequence_parallel in (False, True):
        config = shape_faithful_config((1, 2, 4))
        config.mesh.sequence_parallel = sequence_parallel
        mesh = sharding.make_mesh(1, 2, 4)
        program = train.build_program(config, mesh)
        compiled = program.step.lower(program.abstract_state, train.abstract_batch(config, mesh)).compile()
        temp[sequence_parallel] = compiled.memory_analysis().temp_size_in_bytes
    assert (BATCH // 2, SEQ // 4, HIDDEN) in audit.activation_shapes(compiled.as_text())
    assert temp[True] < temp[False], temp  # LayerNorm, dropout and residuals no longer repeated on 4 devices


def test_collectives_inside_scanned_layers_count_once_per_layer():
    """The gradient reduction is the same whether the layers are unrolled or run in a loop (each iteration reduces
    its layer's gradients); the loop's collectives appear once in the HLO text and must be counted per iteration."""
    reduced = {}
    for scan_layers in (False, True):
        config = shape_faithful_config((1, 8, 1))
        config.model.scan_layers = scan_layers
        _, _, hlo = compiled_step(config)
        reduced[scan_layers] = audit.collective_stats(hlo)["all-reduce"]["bytes"]
    assert reduced[True] == pytest.approx(reduced[False], rel=0.02), reduced
