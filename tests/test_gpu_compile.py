"""The GPU compile check (bert_jax.gpu_compile_check): a small BERT's real train step compiled for an H200 on this
CPU-only machine with JAX's CUDA plugin (the test extra has it), and what must hold of the executable on a GPU.

One compile (bfloat16, no attention dropout, scanned layers, about 10 s) serves every test: "auto" attention runs
cuDNN's fused kernel with padding given as lengths (no [S, S] array anywhere), the layer loop copies at most what
the backward pass reads of each layer, and nothing copies the training state outside it.
"""
import os
import subprocess
import sys

import jax
import pytest

from bert_jax import gpu_compile_check, sharding_audit
from train_helpers import override, tiny_config

SEQ = 96  # unlike every width of the tiny model, so that [.., S, S] names attention scores only
# The layer loop's copies per layer (forward and backward together), as XLA:GPU compiles this step in jax 0.10.2: the
# backward pass copies cuDNN's kept output and softmax statistics out of their stacks, the forward two of the layer's
# weights (the output LayerNorm's, which the carry takes: transformer.PendingNorm) and the carry's pending flag. The
# rest the loop keeps (transformer.SCANNED_SAVES) its kernels read in place. More means a new copy per layer: a
# regression in the scanned step (docs/training.md, "GPU"); before that policy held on GPU, it was 11.
LAYER_LOOP_COPIES = 5


def compiled_for_h200(overrides: dict):
    """(config, executable, gpu_compile_check's report) of the tiny model in bfloat16 without attention dropout (so
    that "auto" attention is cuDNN's), with `overrides`, compiled for an H200."""
    config = override(tiny_config(), {"model.dtype": "bfloat16", "model.attention_probs_dropout_prob": 0.0,
                                       "data.seq_length": SEQ, **overrides})
    step, mesh, seconds = gpu_compile_check.compile_step(config, gpu_compile_check.GPUS["h200"])
    return config, step, gpu_compile_check.report(config, gpu_compile_check.GPUS["h200"], step, mesh, seconds)


@pytest.fixture(scope="module")
def compiled():
    # 3 layers: the loop runs 2, and the last one at the masked positions (transformer.last_layer_at_rows)
    return compiled_for_h200({"model.scan_layers": True, "model.num_hidden_layers": 3, "model.num_hidden_groups": 3})


def test_auto_attention_runs_cudnn_with_padding_as_lengths(compiled):
    config, step, row = compiled
    assert row["attention"] == "cudnn"
    looped = config.model.num_hidden_layers - 1  # the last layer's few query rows take the reference
    attention = row["kernels"]["cudnn_attention"]
    # forward and backward once each: the backward reads what the forward returned (saves_kernel_outputs)
    assert attention["count"] == 2 * looped and attention["in_loops"] == 2 * looped
    hlo = step.as_text()
    assert hlo.count('custom_call_target="__cudnn$fmhaSoftmax"') == 1  # no bias: padding went in as lengths
    assert hlo.count('custom_call_target="__cudnn$fmhaSoftmaxBackward"') == 1
    assert not [s for s in sharding_audit.activation_shapes(hlo, rank=4) if s[-2:] == (SEQ, SEQ)]


def test_the_unscanned_last_layer_computes_the_masked_positions_alone():
    """Unscanned, the last layer computes the masked positions and [CLS] alone (transformer.OutputRows), its
    attention in the reference, the other layers' in cuDNN. Its rows are padded to ROW_MULTIPLES' 16: at this
    model's 6 a row, XLA:GPU found no Triton tiling for the output projection and the compile failed."""
    config, _, row = compiled_for_h200({})
    assert row["kernels"]["cudnn_attention"]["count"] == 2 * (config.model.num_hidden_layers - 1)
    assert row["fits"]


def test_remat_dots_keeps_the_attention_kernels_outputs():
    """remat_policy=dots keeps the matmuls' results, cuDNN attention's among them: its forward runs once a layer,
    not again in the backward pass (gpu_attention.saves_kernel_outputs)."""
    config, _, row = compiled_for_h200({"model.remat_policy": "dots"})
    assert row["kernels"]["cudnn_attention"]["count"] == 2 * (config.model.num_hidden_layers - 1)


def test_the_layer_loop_copies_at_most_what_the_backward_reads(compiled):
    config, _, row = compiled
    assert row["layer_loop_copies_per_layer"] <= LAYER_LOOP_COPIES
    assert row["kernels"]["gemm"]["in_loops"] > 0  # the census sees the loop at all


def test_nothing_copies_the_training_state(compiled):
    """The update keeps non-finite steps out with a select XLA fuses into it: under lax.cond, XLA:GPU copied every
    leaf of the state out of the conditional each step (BERT-base: 621 copies, 1.2 GB)."""
    _, _, row = compiled
    copies = row["kernels"].get("copy", {"write_bytes": 0})
    assert copies["write_bytes"] < 2 ** 10  # a few scalars: the step counters, the layer loop's pending flag
    assert "conditional" not in row["kernels"]
    assert row["fits"] and 0 < row["memory_gb"] < 1


def test_census_counts_loop_bodies_per_iteration_and_tells_slice_copies_from_in_place_updates():
    hlo = """
%slice (p0: f32[4,8], p1: s32[]) -> f32[1,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %dynamic-slice.1 = f32[1,8]{1,0} dynamic-slice(%p0, %p1, %p1), dynamic_slice_sizes={1,8}
  ROOT %copy.1 = f32[1,8]{1,0} copy(%dynamic-slice.1)
}

%update (p0: f32[4,8], p1: f32[1,8], p2: s32[]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[1,8]{1,0} parameter(1)
  %p2 = s32[] parameter(2)
  ROOT %dynamic-update-slice.1 = f32[4,8]{1,0} dynamic-update-slice(%p0, %p1, %p2, %p2)
}

%body (param: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %param = (s32[], f32[4,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%param), index=0
  %x = f32[4,8]{1,0} get-tuple-element(%param), index=1
  %s = f32[1,8]{1,0} fusion(%x, %i), kind=kCustom, calls=%slice
  %u = f32[4,8]{1,0} fusion(%x, %s, %i), kind=kLoop, calls=%update
  ROOT %t = (s32[], f32[4,8]{1,0}) tuple(%i, %u)
}

%cond (param: (s32[], f32[4,8])) -> pred[] {
  %param = (s32[], f32[4,8]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[4,8]) -> f32[4,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4,8]{1,0}) tuple(%zero, %a)
  %w = (s32[], f32[4,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  %out = f32[4,8]{1,0} get-tuple-element(%w), index=1
  %gemm = f32[4,8]{1,0} custom-call(%out, %out), custom_call_target="__cublas$gemm"
  ROOT %c2 = f32[4,8]{1,0} copy(%gemm)
}
"""
    census = gpu_compile_check.kernel_census(hlo)
    row = 32  # bytes of f32[1,8]
    assert census == {
        "slice_copy": {"count": 4, "in_loops": 4, "read_bytes": 4 * (row + 4), "write_bytes": 4 * row},
        "fusion": {"count": 4, "in_loops": 4, "read_bytes": 4 * (row + 4), "write_bytes": 4 * (row + 4)},
        "gemm": {"count": 1, "in_loops": 0, "read_bytes": 2 * 4 * row, "write_bytes": 4 * row},
        "copy": {"count": 1, "in_loops": 0, "read_bytes": 4 * row, "write_bytes": 4 * row}}


def test_an_unknown_gpu_is_one_line_and_exit_code_1():
    result = subprocess.run([sys.executable, "-m", "bert_jax.gpu_compile_check", "--config=configs/bert.py:tiny",
                             "--gpu=a100"], capture_output=True, text=True, timeout=300,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: --gpu='a100': name one of h100, h200"], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_the_deviceless_environment_reaches_jax_imported_before_it(monkeypatch):
    """The commands import JAX before their flags are parsed: JAX_PLATFORMS set then must still keep JAX off every
    other backend (installed libtpu would search for a TPU and log errors)."""
    monkeypatch.setattr(os, "environ", {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"})
    platforms = jax.config.jax_platforms
    jax.config.update("jax_platforms", "")  # as imported with JAX_PLATFORMS unset
    try:
        gpu_compile_check.set_deviceless_environment()
        assert (os.environ["JAX_PLATFORMS"], jax.config.jax_platforms) == ("cpu", "cpu")
    finally:
        jax.config.update("jax_platforms", platforms)
