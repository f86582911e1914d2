"""The compiled train step holds the layout the rules promise, read from its HLO on 8 CPU devices.

A small model with BERT's structure is compiled as the trainer compiles it, for data, FSDP, tensor and mixed meshes:
8 heads so that every mesh below splits them, and a vocabulary of 1000 (padded to 1152) so that the tied word
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


@pytest.mark.parametrize("tensor", [3, 6])
def test_every_tensor_size_the_heads_allow_splits_the_padded_vocabulary(tensor):
    """BERT-base's 12 heads allow tensor 3 and 6 (docs/training.md); the vocabulary, padded to 30720, takes them."""
    config = config_lib.load_preset("bert", "base")
    train.validate(config, sharding.make_mesh(1, 1, tensor, devices=jax.devices()[:tensor]))


@pytest.mark.parametrize("heads, tensor, message", [
    (12, 8, "config.model.num_attention_heads=12 does not split over mesh tensor=8; choose mesh.tensor among "
            r"\[1, 2, 3, 4, 6, 12\]$"),
    (7, 7, r"config.model.vocab_size=30522 \(padded to 30720 rows\) does not split over mesh tensor=7; choose "
           r"mesh.tensor among \[1\]$"),
])
def test_refusals_list_only_the_sizes_every_check_accepts(heads, tensor, message):
    config = config_lib.load_preset("bert", "base")
    config.model.update(num_attention_heads=heads, hidden_size=64 * heads, embedding_size=64 * heads,
                        intermediate_size=256 * heads)
    with pytest.raises(sharding.MeshError, match=message):
        train.validate(config, sharding.make_mesh(1, 1, tensor, devices=jax.devices()[:tensor]))


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


# ---- XLA:TPU's forms, each proved on a hand-built module (shapes and attributes as libtpu writes them) -----------

ADD = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}
"""
FUSED_REDUCE_SCATTER = """%all-reduce-scatter.1 (input.1: bf16[1024,128]) -> bf16[1024,32] {
  %input.1 = bf16[1024,128]{0,1:T(8,128)(2,1)} parameter(0)
  %all-reduce.141 = bf16[1024,128]{0,1:T(8,128)(2,1)} all-reduce(%input.1), channel_id=92, \
replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %partition-id.47 = u32[] partition-id()
  ROOT %dynamic-slice.3 = bf16[1024,32]{0,1:T(8,128)(2,1)} dynamic-slice(%all-reduce.141, %c, %partition-id.47), \
dynamic_slice_sizes={1024,32}
}
"""
ASYNC_REDUCE_SCATTER = """%async_computation.2 (p.1: f32[64,16]) -> f32[16,16] {
  %p.1 = f32[64,16]{1,0} parameter(0)
  ROOT %reduce-scatter.3 = f32[16,16]{1,0} reduce-scatter(%p.1), channel_id=5, replica_groups=[2,4]<=[8], \
dimensions={0}, to_apply=%add
}
"""


def chain_link(number: int, chain: int) -> str:
    """One of XLA:TPU's continuation fusions: a piece of the all-gather of chain `chain`, which every link of the
    chain writes out in full (the operand and the result buffer pass from link to link)."""
    return (f"%async_collective_fusion.{number} (param_0.{number}: bf16[2,128], param_1.{number}: bf16[8,128]) -> "
            f"(bf16[2,128], bf16[8,128]) {{\n  %param_0.{number} = bf16[2,128]{{1,0:T(8,128)(2,1)}} parameter(0)\n"
            f"  %all-gather.{number} = bf16[8,128]{{1,0:T(8,128)(2,1)}} all-gather(%param_0.{number}), channel_id=98, "
            "replica_groups=mesh['axis_0'=1,'axis_1'=4] {'axis_1'}, dimensions={0}, use_global_device_ids=true, "
            f'frontend_attributes={{chain_id="{chain}"}}\n  ROOT %tuple.{number} = (bf16[2,128]{{1,0}}, '
            f"bf16[8,128]{{1,0}}) tuple(%param_0.{number}, %all-gather.{number})\n}}\n")


def chained_fusions(links: range) -> str:
    """Lines calling the continuation fusions numbered `links`, in order."""
    return "".join(f"  %fusion.{n} = (bf16[2,128]{{1,0}}, bf16[8,128]{{1,0}}) fusion(%x, %y), kind=kCustom, "
                   f"calls=%async_collective_fusion.{n}\n" for n in links)


def module(entry: str, *computations: str) -> str:
    header = "HloModule jit_traced, is_scheduled=true, input_output_alias={ {0}: (0, {}, may-alias) }\n\n"
    return header + "\n".join([ADD, *computations]) + "\nENTRY %main.1 (p0: f32[256]) -> f32[256] {\n" + entry + "}\n"


def loop(body_lines: str, trips: int | None, *computations: str, before: str = "") -> str:
    """A module whose entry runs `body_lines` in a while loop: of known trip count (XLA:CPU), or, with trips None,
    bounded by its condition alone (XLA:TPU; 24 iterations). The entry runs the lines `before` first."""
    body = ("%body.1 (param.1: (s32[], bf16[8,128])) -> (s32[], bf16[8,128]) {\n"
            "  %param.1 = (s32[], bf16[8,128]{1,0}) parameter(0)\n" + body_lines + "}\n")
    cond = ("%cond.1 (param.2: (s32[], bf16[8,128])) -> pred[] {\n  %constant.14 = s32[]{:T(128)} constant(24)\n"
            "  %param.2 = (s32[], bf16[8,128]{1,0}) parameter(0)\n  %i = s32[]{:T(128)} get-tuple-element(%param.2), "
            "index=0\n  ROOT %lt.0 = pred[]{:T(512)} compare(%i, %constant.14), direction=LT\n}\n")
    known = f', backend_config={{"known_trip_count":{{"n":"{trips}"}}}}' if trips else ""
    entry = f"  %while.1 = (s32[], bf16[8,128]{{1,0}}) while(%tuple.1), condition=%cond.1, body=%body.1{known}\n"
    return module(before + entry, *computations, body, cond)


TPU_FORMS = {
    "sync all-reduce": (module(
        "  %all-reduce.1 = f32[256]{0:T(256)} all-reduce(%p0), channel_id=2, "
        "replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0','axis_1'}, use_global_device_ids=true, to_apply=%add\n"),
        "all-reduce", 1, 1024),
    "async all-reduce pair": (module(
        "  %all-reduce-start = f32[256]{0} all-reduce-start(%p0), channel_id=1, replica_groups=[1,4]<=[4], "
        "to_apply=%add\n  %all-reduce-done = f32[256]{0} all-reduce-done(%all-reduce-start)\n"), "all-reduce", 1, 1024),
    "async all-gather pair, operand and result in the start's tuple": (module(
        "  %all-gather-start = (bf16[2,128]{1,0}, bf16[8,128]{1,0}) all-gather-start(%x), channel_id=3, "
        "replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true\n"
        "  %all-gather-done = bf16[8,128]{1,0} all-gather-done(%all-gather-start)\n"), "all-gather", 1, 2048),
    "async reduce-scatter pair, counted by its operand": (module(
        "  %reduce-scatter-start = (f32[64,16]{1,0}, f32[16,16]{1,0}) reduce-scatter-start(%z), channel_id=4, "
        "replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add\n"
        "  %reduce-scatter-done = f32[16,16]{1,0} reduce-scatter-done(%reduce-scatter-start)\n"),
        "reduce-scatter", 1, 4096),
    "reduce-scatter wrapped in async-start": (module(
        "  %rs-start = ((f32[64,16]{1,0}), f32[16,16]{1,0}) async-start(%z), calls=%async_computation.2\n"
        "  %rs-done = f32[16,16]{1,0} async-done(%rs-start)\n", ASYNC_REDUCE_SCATTER), "reduce-scatter", 1, 4096),
    "all-reduce fused with its slice (all-reduce-scatter)": (module(
        "  %fusion.7 = bf16[1024,32]{1,0:T(8,128)(2,1)} fusion(%g), kind=kCustom, calls=%all-reduce-scatter.1\n",
        FUSED_REDUCE_SCATTER), "reduce-scatter", 1, 1024 * 128 * 2),
    "collective-permute pair with context scalars": (module(
        "  %collective-permute-start.1 = (bf16[32,2]{0,1:T(2,128)(2,1)}, bf16[32,2]{0,1:T(2,128)(2,1)}, u32[]{:S(2)}, "
        "u32[]{:S(2)}) collective-permute-start(%q), channel_id=166, source_target_pairs={{0,3},{1,0},{2,1},{3,2}}\n"
        "  %collective-permute-done.1 = bf16[32,2]{0,1:T(2,128)(2,1)} collective-permute-done("
        "%collective-permute-start.1)\n"), "collective-permute", 1, 128),
    "all-gathers carried through chains of fusions (2 links of one chain, 1 of another)": (module(
        chained_fusions(range(3)), *(chain_link(n, chain) for n, chain in enumerate([14, 14, 15]))),
        "all-gather", 2, 2 * 2048),
    "a chain begun before a loop and carried on in its body, and a chain wholly in the body": (loop(
        chained_fusions(range(1, 4)), 24, *(chain_link(n, chain) for n, chain in reversed([*enumerate([7, 7, 8, 8])])),
        before=chained_fusions(range(1))), "all-gather", 1 + 24, (1 + 24) * 2048),  # a body link read first
    "async all-gather in a loop body": (loop(
        "  %all-gather-start = (bf16[2,128]{1,0}, bf16[8,128]{1,0}) all-gather-start(%x), channel_id=3, "
        "replica_groups=[1,4]<=[4], dimensions={0}\n  %all-gather-done = bf16[8,128]{1,0} all-gather-done("
        "%all-gather-start)\n", 12), "all-gather", 12, 12 * 2048),
    "loop whose trip count is only in its condition (XLA:TPU)": (loop(
        "  %all-gather-start = (bf16[2,128]{1,0}, bf16[8,128]{1,0}) all-gather-start(%x), channel_id=3, "
        "replica_groups=[1,4]<=[4], dimensions={0}\n  %all-gather-done = bf16[8,128]{1,0} all-gather-done("
        "%all-gather-start)\n", None), "all-gather", 24, 24 * 2048),
    "fused reduce-scatter called from a loop body": (loop(
        "  %fusion.7 = bf16[1024,32]{1,0} fusion(%g), kind=kCustom, calls=%all-reduce-scatter.1\n", 24,
        FUSED_REDUCE_SCATTER), "reduce-scatter", 24, 24 * 1024 * 128 * 2),
}


@pytest.mark.parametrize("form", TPU_FORMS)
def test_each_tpu_collective_form_is_counted_once_by_its_data(form):
    hlo, kind, count, size = TPU_FORMS[form]
    stats = audit.collective_stats(hlo)
    assert stats[kind] == {"count": count, "bytes": size}, stats
    assert audit.total_bytes(stats) == size, stats  # nothing else counted: no start and done both, no tuple doubled
    assert audit.wire_bytes(stats) == audit.WIRE_FACTOR[kind] * size


def test_the_ideal_counts_zero3_gathers_and_wire_bytes():
    """FSDP's ideal gathers every split parameter twice (forward, backward) and reduce-scatters its gradient once:
    about its data size on the wire. Data parallelism's all-reduce puts twice its data size on the wire."""
    ideal = {}
    for mesh_shape in [(8, 1, 1), (1, 8, 1)]:
        config = shape_faithful_config(mesh_shape)
        mesh = sharding.make_mesh(*mesh_shape)
        program = train.build_program(config, mesh)
        terms = audit.ideal_bytes(config, mesh, program.state_shardings["params"], program.abstract_state["params"])
        ideal[mesh_shape] = (sum(terms.values()), audit.ideal_wire_bytes(config, terms), terms)
    data_parallel, fsdp = ideal[(8, 1, 1)], ideal[(1, 8, 1)]
    assert data_parallel[1] == 2 * data_parallel[0]
    assert fsdp[2]["parameter_gathers"] == 2 * fsdp[2]["gradient_reduce_scatter"] > 0
    assert fsdp[0] < fsdp[1] < 1.1 * fsdp[0]  # only the unsplit vectors (biases) are all-reduced
    assert fsdp[2]["gradient_reduce_scatter"] == pytest.approx(data_parallel[0], rel=0.05)  # operands: whole grads
