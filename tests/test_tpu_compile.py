"""bert_jax.compile_check: the train step compiled by XLA:TPU for a v5p slice on this CPU machine (libtpu, no TPU).

One small BERT is compiled once for v5p-8 (4 chips) on a (data 2, fsdp 2) mesh in bfloat16 without attention
dropout, and its executable is read: it fits, every activation keeps the batch split over data x fsdp, FSDP's
gradients are reduce-scattered, the collectives are within 0.7-1.3x of the layout's ideal, the state is donated, and
"auto" attention ran bert_jax's flash kernel on the projection's stacked Q, K and V (and a tiny ModernBERT's layers
Pallas' splash). The same BERT under pure FSDP on v5e-8, whose compiler carries each
all-gather through a chain of fusions, moves as little. A step that cannot fit ends the command with one line and
exit code 1. A layer shared by all of them (ALBERT) is gathered and reduced once a step, and so is the word table
that the lookup and the MLM head share.
"""
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

from bert_jax import cli, compile_check, config_lib, flops
from bert_jax import sharding_audit as audit
from bert_jax.modeling.transformer import padded_vocab_size

REPO = pathlib.Path(__file__).resolve().parents[1]
BATCH, SEQ, FFN = 16, 256, 512  # S is not 128, the lane width of splash's statistics ([.., S, 128])


@pytest.mark.parametrize("name, chips, grid, hosts", [
    ("v5p-8", 4, (2, 2, 1), 1), ("v5p-128", 64, (4, 4, 4), 16), ("v4-32", 16, (2, 2, 4), 4),
    ("v5e-8", 8, (2, 4), 1), ("v5e-16", 16, (4, 4), 4), ("v6e-64", 64, (8, 8), 16), ("v5p:4x4x8", 128, (4, 4, 8), 32),
])
def test_topology_names_as_cloud_tpu_writes_them(name, chips, grid, hosts):
    topology = compile_check.parse_topology(name)
    assert (topology.chips, topology.grid, topology.hosts) == (chips, grid, hosts)


@pytest.mark.parametrize("name, message", [
    ("v5p-12", "v5p-12: 12 is not a power-of-two slice"),
    ("v7x-8", "name a TPU slice as v4-N, v5p-N"),
    ("v5e:2x2x2", "v5e slices are 2-D grids"),
])
def test_unknown_topologies_are_one_line(name, message):
    with pytest.raises(compile_check.TopologyError, match=message):
        compile_check.parse_topology(name)


REFUSAL = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (1.33T) "
           "exceeds available HBM (95.74G).\nmore")  # the tiny BERT at 262144 a chip on v5p-8, as libtpu says it


@pytest.mark.parametrize("message, key, needed", [
    (REFUSAL, "temp_gb", 1.33 * 1024), (REFUSAL.replace("1.33T", "208.62G"), "temp_gb", 208.62),
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Used 1.02T of 95.74G hbm.", "needed_gb", 1.02 * 1024),
])
def test_the_compilers_refusal_is_read_in_gb_in_any_unit(message, key, needed):
    figures = compile_check.out_of_memory_figures(message)
    assert figures[key] == pytest.approx(needed) and figures["hbm_gb"] == pytest.approx(95.74)


def refused_row(state_gb: float = 0.02, temp_gb: float = 1.33 * 1024, batch_per_chip: int = 262144) -> dict:
    """The row report gives a step the compiler refused on v5p-8 (4 chips)."""
    return {"topology": "v5p-8", "chips": 4, "batch_per_chip": batch_per_chip, "state_gb": state_gb,
            **compile_check.refused_memory({"temp_gb": temp_gb, "hbm_gb": 95.74}, state_gb)}


def bert_config(remat_policy: str, scan_layers: bool, family: str = "bert"):
    config = config_lib.load_preset(family, "tiny")
    config.model.update(remat_policy=remat_policy, scan_layers=scan_layers)
    config.mesh.data = 4
    return config


def test_a_refusal_names_the_overshoot_in_gb_and_the_batch_that_fits():
    message = compile_check.overshoot_message(refused_row(), bert_config("none", False))
    assert "needs 1361.9 GB, 1266.2 GB more than the 95.74 GB of HBM the compiler allows a chip on v5p-8" in message
    # 5.2 MB an example: 92% of 95.74 GB holds 16944 (a multiple of 8), 67776 on 4 chips
    assert "config.data.batch_size=67776 (16944 a chip" in message and "now 262144" in message


def test_without_remat_scanning_is_advised_only_where_each_layer_has_its_own_weights():
    """Scanned without remat, BERT's loop keeps only the named activations (9.7 against 10.5 GB for BERT-base s128 on
    v5p-8); ALBERT's shared layer keeps more scanned (16.7 against 15.1 GB for ALBERT-xxlarge): no scan advice
    there."""
    message = compile_check.overshoot_message(refused_row(), bert_config("none", False))
    assert "remat_policy=dots or full" in message and "fsdp" not in message
    assert "scan_layers=true (the layer loop keeps only its named activations)" in message
    shared = compile_check.overshoot_message(refused_row(), bert_config("none", False, family="albert"))
    assert "remat_policy=dots or full" in shared and "scan_layers" not in shared
    assert "scan_layers" not in compile_check.overshoot_message(refused_row(), bert_config("none", True))


def test_with_remat_the_advice_is_scanning_and_never_remat_again():
    message = compile_check.overshoot_message(refused_row(), bert_config("dots", False))
    assert "scan_layers=true" in message and "remat_policy" not in message
    assert "remat_policy" not in compile_check.overshoot_message(refused_row(), bert_config("full", True))


def test_fsdp_is_advised_only_where_the_state_dominates():
    state_bound = compile_check.overshoot_message(refused_row(state_gb=80, temp_gb=40, batch_per_chip=8),
                                                  bert_config("full", True))
    assert "config.mesh.fsdp=-1 (parameters and optimizer state, 80.0 GB" in state_bound
    assert "fsdp" not in compile_check.overshoot_message(refused_row(), bert_config("full", True))


def layout_row(scan_layers: bool, batch_per_chip: int, step_s, fits: bool = True, cycles_s=None) -> dict:
    """A row of benchmarks/tpu_compile.py for one layer layout of bert-base-128@v5p-8."""
    return {"base_name": "bert-base-128@v5p-8", "scan_layers": scan_layers, "fits": fits, "per_chip_gb": 80.0,
            "batch_per_chip": batch_per_chip, "est_step_s": step_s, "est_mfu": step_s and 0.5,
            "est_tokens_per_s_per_chip": step_s and batch_per_chip * 128 / step_s,
            "est_step_cycles_s": cycles_s or step_s and step_s * 1.4}


def tpu_compile_benchmark():
    spec = importlib.util.spec_from_file_location("tpu_compile", REPO / "benchmarks" / "tpu_compile.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_layout_recommended_is_the_faster_one_that_fits():
    """--layout=auto compares the layouts each at its own largest batch: tokens a second, not step times."""
    bench = tpu_compile_benchmark()
    scanned, unscanned = layout_row(True, 840, 0.30), layout_row(False, 256, 0.08)  # 358K against 410K tokens/s
    assert bench.recommendation([scanned, unscanned]).startswith("bert-base-128@v5p-8: train unscanned at 256")
    assert "train scanned at 840" in bench.recommendation([scanned, layout_row(False, 512, 0.16, fits=False)])
    no_time = [layout_row(True, 840, None), layout_row(False, 256, None)]  # v5e: the larger batch
    assert bench.recommendation(no_time).startswith("bert-base-128@v5p-8: train scanned at 840")
    assert bench.recommendation([layout_row(True, 8, 0.1, fits=False)]) == "bert-base-128@v5p-8: no layout fits"
    assert "unsettled" not in bench.recommendation([scanned, unscanned])
    # ELECTRA-large's rows: scanned faster by the cost model's scaled loops, slower by the cycle sums.
    electra = bench.recommendation([layout_row(True, 160, 0.407, cycles_s=0.979),
                                    layout_row(False, 144, 0.461, cycles_s=0.612)])
    assert electra.startswith("bert-base-128@v5p-8: train scanned at 160")
    assert electra.endswith("; unsettled: by the cycle sums unscanned is faster (612 against 979 ms)")
    floored = bench.recommendation([{**layout_row(True, 208, 0.499, cycles_s=1.129), "est_floored": True},
                                    layout_row(False, 192, 0.604, cycles_s=0.730)])
    assert floored.startswith("bert-base-128@v5p-8: train scanned at 208 a chip, 80.0 GB, est. 499 ms (the model's "
                              "FLOPs at peak), MFU 0.50 (against unscanned at 192 a chip, 80.0 GB, est. 604 ms, MFU")


def test_the_table_names_the_kernels_each_presets_layers_run():
    label = lambda preset, dropout, attention="splash": tpu_compile_benchmark().attention_label(
        {"preset": preset, "attention_dropout": dropout, "attention": attention})
    assert label("bert-base", 0.0) == "flash" and label("bert-large", 0.1) == "flash, dropout 0.1"
    assert label("modernbert-base", 0.0) == "splash"  # Q, K and V as three arrays, and local windows
    assert label("modernbert-base", 0.1) == "flash, dropout 0.1" and label("bert-base", 0.0, "xla") == "xla"


libtpu = pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu (pip install -e '.[tpu]')")


@pytest.mark.parametrize("name, num_slices, devices, kind", [
    ("v5p-8", 1, 4, "TPU v5"), ("v4-8", 1, 4, "TPU v4"), ("v5e-8", 1, 8, "TPU v5 lite"), ("v5p-8", 2, 8, "TPU v5"),
])
def test_topology_devices_are_one_per_chip(name, num_slices, devices, kind):
    found = compile_check.topology_devices(compile_check.parse_topology(name, num_slices))
    assert len(found) == devices and found[0].device_kind == kind and found[0].platform == "tpu"


def small_bert(batch: int = BATCH):
    """BERT's structure at a size XLA:TPU compiles in seconds; 8 heads, rows in splash's 128-token tiles."""
    config = config_lib.load_preset("bert", "tiny")
    config.model.update(dict(hidden_size=128, num_attention_heads=8, intermediate_size=FFN, num_hidden_layers=2,
                             num_hidden_groups=2, embedding_size=128, vocab_size=1000, dtype="bfloat16",
                             attention_probs_dropout_prob=0.0))
    config.data.batch_size, config.data.seq_length = batch, SEQ
    config.masking.max_predictions_per_seq = 10
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 1
    return config


def compile_step(config, topology: str = "v5p-8"):
    """The train step alone (no evaluation step) of `config`, compiled for `topology`."""
    return compile_check.compile_program(config, compile_check.parse_topology(topology), with_eval=False)


@pytest.fixture(scope="module")
def compiled():
    return compile_step(small_bert())


def test_the_step_fits_and_reads_as_the_compilers_estimate(compiled):
    row = compile_check.report(compiled)
    assert row["fits"] and 0 < row["per_chip_gb"] < row["hbm_gb"] == 95.74  # the compiler's figure, not 95
    assert row["state_gb"] < row["per_chip_gb"] and row["temp_gb"] > 0
    assert row["est_step_s"] > row["compiler_step_s"] > 0  # the splash kernels' FLOPs are added to what XLA sees
    assert 0 < row["est_mfu"] < 1 and row["model_flops"] > 0
    assert row["attention"] == "splash" and row["donated"]


def test_the_step_compiles_with_the_scoped_vmem_limit_a_tpu_run_gets(data_parallel):
    """cli.TPU_COMPILER_FLAGS reach libtpu here as in a TPU run. Under libtpu's own limit no fusion of this step takes
    more than 5.6 MiB of scoped VMEM (libtpu 0.0.42.1); under bert_jax's, its FFN's matmul fusions tile larger
    (6.8 MiB)."""
    assert set(cli.TPU_COMPILER_FLAGS) <= set(os.environ["LIBTPU_INIT_ARGS"].split())
    used = re.findall(r'"used_scoped_memory_configs":\[\{"memory_space":"1","offset":"\d+","size":"(\d+)"',
                      data_parallel.step.as_text())
    assert max(map(int, used)) > 6 * 2**20


def test_cycles_are_told_apart_by_op_name_for_module_methods_too():
    """ELECTRA traces its two halves as jvp(Electra.generator_logits): model work, not the optimizer update."""
    line = ('  %f.{i} = f32[8] fusion(%p), kind=kLoop, metadata={{op_name="{name}"}}, '
            'backend_config={{"estimated_cycles":"{c}"}}')
    ops = [("jit(traced)/jvp(Electra.generator_logits)/generator/encoder/layer_0/gelu", 30),
           ("jit(traced)/jvp(Model)/backbone/encoder/layer_1/gelu", 30), ("jit(traced)/jvp(Model)/x/norm/mul", 20),
           ("jit(traced)/adam/mul", 20)]
    hlo = "ENTRY %main (p: f32[8]) -> f32[8] {\n" + "\n".join(
        line.format(i=i, name=name, c=cycles) for i, (name, cycles) in enumerate(ops)) + "\n}\n"
    shares = compile_check.cycle_shares(hlo)
    assert (shares["other_elementwise"], shares["layer_norms"], shares["optimizer"]) == (0.6, 0.2, 0.2)
    assert shares["other: jvp(Electra.generator_logits)/generator/encoder/layer_N/gelu"] == 0.3


def test_a_negative_compiler_time_gives_no_estimate_rather_than_a_wrong_one():
    """libtpu's cost model returns negative seconds for v4, v5e and v6e steps: no time, MFU or days then."""
    config, topology = small_bert(), compile_check.parse_topology("v5e-8")
    assert set(compile_check.step_estimates(config, topology, -19.0, 1e12, 1e12, 0.03).values()) == {None}
    figures = compile_check.step_estimates(config, topology, 0.01, topology.chip.peak_flops * 0.01, 1e12, 0.03)
    assert figures["est_step_s"] == pytest.approx(0.02) and figures["splash_share"] == pytest.approx(0.5)
    assert figures["est_mfu"] == pytest.approx(1e12 / (0.02 * topology.chip.peak_flops))
    assert figures["est_step_cycles_s"] == pytest.approx(0.04)  # the cycle sum, the kernels' FLOPs at peak added
    assert not figures["est_floored"]


def test_an_estimate_faster_than_the_chips_peak_is_floored_at_the_models_flops():
    """A loop's scaled optimal_seconds can come out below the model's FLOPs at peak: no step runs that fast."""
    config, topology = small_bert(), compile_check.parse_topology("v5p-8")
    model_flops = topology.chip.peak_flops * 0.05
    figures = compile_check.step_estimates(config, topology, 0.04, topology.chip.peak_flops * 0.005, model_flops, 0.09)
    assert figures["est_floored"] and figures["est_step_s"] == pytest.approx(0.05)
    assert figures["est_mfu"] == pytest.approx(1.0) and figures["est_step_cycles_s"] == pytest.approx(0.095)


def data_parallel_bert(scan_layers: bool = False):
    """small_bert with 16 rows a chip on 4 data-parallel chips: enough work a layer for the layer loop to show, and
    3 layers, so that scanned the loop runs 2 before the last one runs at the masked positions."""
    config = small_bert(batch=64)
    config.mesh.data, config.mesh.fsdp = 4, 1
    config.model.num_hidden_layers = config.model.num_hidden_groups = 3
    config.model.scan_layers = scan_layers
    return config


@pytest.fixture(scope="module")
def data_parallel():
    return compile_step(data_parallel_bert())


def test_a_scanned_step_is_estimated_as_its_layer_loop_runs(data_parallel):
    """XLA's cost analysis costs a while body once. Counted per iteration, the scanned step's cycle sum is 1.23x the
    full unscanned compile's (the scanned program also recomputes LayerNorm, GELU and dropout, and writes each
    layer's saved activations into the loop's stacks and copies them back out), where counted once it read 0.90x;
    its optimal_seconds, scaled by the cycles' loop factor, 1.16x: the rough end of the estimate. (With 2 layers,
    all in the loop, and before Q, K and V were laid out heads side by side, which this model's 16-wide heads
    gained most from: 1.49x, 0.91x, 1.62x.)"""
    scanned = compile_check.report(compile_step(data_parallel_bert(scan_layers=True)))
    unscanned = compile_check.report(data_parallel)
    assert scanned["estimate"].startswith("while-loop bodies counted per iteration") and scanned["loop_factor"] > 1.3
    assert unscanned["estimate"] == "as compiled" and unscanned["loop_factor"] == 1
    cycles = scanned["est_step_cycles_s"] / unscanned["est_step_cycles_s"]
    assert 1.0 <= cycles <= 1.6 and cycles / scanned["loop_factor"] < 1.0, (scanned, unscanned)
    assert 0.8 <= scanned["est_step_s"] / unscanned["est_step_s"] <= 1.7, (scanned, unscanned)
    # Work alike: both compute the last layer at the masked positions' rows alone (transformer.last_layer_at_rows).
    assert flops.train_step_flops(data_parallel_bert(scan_layers=True)) == flops.train_step_flops(data_parallel_bert())
    work = lambda row: row["hlo_flops"] + row["splash_flops"]
    assert 0.9 <= work(scanned) / work(unscanned) <= 1.1, (scanned, unscanned)
    for row in (scanned, unscanned):  # the per-instruction cycle sum: the slow end of the range
        assert row["est_step_cycles_s"] > row["est_step_s"] and row["est_mfu_cycles"] < row["est_mfu"]


def test_the_batch_is_split_over_data_and_fsdp_on_tpu(compiled):
    shapes = audit.activation_shapes(compiled.step.as_text())
    assert (BATCH // 4, SEQ, FFN) in shapes
    assert not [s for s in shapes if s[:2] == (BATCH, SEQ)]


def collectives_and_ideal(compiled) -> tuple[dict, dict]:
    ideal = audit.ideal_bytes(compiled.config, compiled.mesh, compiled.program.state_shardings["params"],
                              compiled.program.abstract_state["params"])
    return audit.collective_stats(compiled.step.as_text()), ideal


def test_collectives_on_the_tpu_hlo_are_near_the_ideal_and_fsdp_reduce_scatters(compiled):
    hlo = compiled.step.as_text()
    stats, ideal = collectives_and_ideal(compiled)
    assert 0.7 <= audit.total_bytes(stats) / sum(ideal.values()) <= 1.3, (stats, ideal)
    assert 0.7 <= audit.wire_bytes(stats) / audit.ideal_wire_bytes(compiled.config, ideal) <= 1.3
    # FSDP's gradients leave as reduce-scatters (XLA:TPU fuses them with their all-reduce), not whole all-reduces:
    # all the layers' are; the embedding tables' (a third of this model, gradients of a lookup) are all-reduced.
    assert stats["reduce-scatter"]["bytes"] >= 0.6 * ideal["gradient_reduce_scatter"]
    assert stats["all-gather"]["bytes"] >= 0.7 * ideal["parameter_gathers"]
    assert audit.donated_inputs(hlo) == len(jax.tree.leaves(compiled.program.abstract_state))


def test_v5e_fsdp_collectives_count_each_chained_all_gather_once():
    """XLA:TPU for v5e splits each FSDP all-gather over a chain of fusions that all write it out; counted per link,
    this step read as 3-4x its ideal."""
    config = small_bert(batch=64)
    config.mesh.data, config.mesh.fsdp = 1, 8
    compiled = compile_step(config, "v5e-8")
    assert 'chain_id="' in compiled.step.as_text()
    stats, ideal = collectives_and_ideal(compiled)
    assert 0.7 <= audit.total_bytes(stats) / sum(ideal.values()) <= 1.3, (stats, ideal)
    assert stats["all-gather"]["bytes"] <= 1.3 * ideal["parameter_gathers"]


def test_a_shared_layer_is_gathered_and_reduced_once_a_step():
    """ALBERT's sharing: one layer applied 6 times. Read inside the layer loop, it was gathered for every application
    and its gradient reduced in float32 (3x the ideal here); read once a step (train.shared_weights_read_once), it
    moves what one layer of its own would."""
    config = small_bert(batch=64)
    config.model.update(num_hidden_layers=6, num_hidden_groups=1, scan_layers=True)
    compiled = compile_step(config)
    stats, ideal = collectives_and_ideal(compiled)
    assert 0.7 <= audit.total_bytes(stats) / sum(ideal.values()) <= 1.3, (stats, ideal)


def test_data_parallelism_reduces_the_tied_word_tables_gradient_once(data_parallel):
    """The word table serves the lookup and the MLM head's projection. Cast to bfloat16 for each use, XLA:TPU
    all-reduced the two gradients apart (1.22x the ideal here); cast once a step (train.shared_weights_read_once),
    each chip adds them before the one all-reduce."""
    config = data_parallel.config
    table = f"bf16[{padded_vocab_size(config.model)},{config.model.embedding_size}]"
    reduced = re.findall(r"= (.*) all-reduce(?:-start)?\(", data_parallel.step.as_text())
    assert sum(results.count(table) for results in reduced) == 1
    stats, ideal = collectives_and_ideal(data_parallel)
    assert audit.total_bytes(stats) / sum(ideal.values()) <= 1.1, (stats, ideal)


def kernel_qkv_sources(hlo: str, kernel: str) -> list[set[str]]:
    """For each call of `kernel`, the HLO values its Q, K and V operands (after the scalar-prefetched keys) are,
    read through bitcasts, which copy nothing."""
    definitions = dict(re.findall(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$", hlo, re.MULTILINE))

    def source(name):
        bitcast = re.match(r"\S+ bitcast\(%([\w.\-]+)\)", definitions[name])
        return source(bitcast.group(1)) if bitcast else name

    calls = re.findall(rf"^\s*%{kernel}[\w.]* = .*? custom-call\(([^)]*)\)", hlo, re.MULTILINE)
    return [{source(operand.strip().lstrip("%")) for operand in re.sub(r"/\*.*?\*/", "", call).split(",")[1:4]}
            for call in calls]


def test_bert_jaxs_flash_kernel_runs_global_attention_in_the_tpu_step(compiled):
    """Without attention dropout, "auto" on TPU runs bert_jax's flash kernel over global attention
    (transformer.tpu_kernel), and it reads Q, K and V from the one stacked array the projection wrote. The last
    layer's few query rows (the masked positions: transformer.OutputRows) take the reference instead."""
    hlo = compiled.step.as_text()
    assert "bert_jax_flash_fwd" in hlo and "bert_jax_flash_bwd" in hlo and "splash_mha" not in hlo
    assert not [s for s in audit.activation_shapes(hlo, rank=4) if s[-2:] == (SEQ, SEQ)]  # no [.., S, S] array
    for kernel in ("bert_jax_flash_fwd", "bert_jax_flash_bwd"):
        sources = kernel_qkv_sources(hlo, kernel)
        layers = compiled.config.model.num_hidden_layers
        assert len(sources) == layers - 1 and all(len(qkv) == 1 for qkv in sources), (kernel, sources)


def test_modernberts_layers_run_splash_on_tpu():
    """ModernBERT's layers hand attention three arrays (RoPE rotates Q and K apart from V): its local and global
    layers take Pallas' splash kernel, which reads them so, and skips the tiles outside a local window."""
    config = config_lib.load_preset("modernbert", "tiny")
    config.model.update(dict(dtype="bfloat16", local_attention=128))  # layer 0 global, layers 1 and 2 local
    config.data.batch_size, config.data.seq_length = 8, SEQ
    config.masking.max_predictions_per_seq = 10
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 4, 1, 1
    hlo = compile_step(config).step.as_text()
    calls = lambda kernel: len(re.findall(rf"^\s*%{kernel}[\w.]* = ", hlo, re.MULTILINE))
    assert (calls("bert_jax_flash_fwd"), calls("splash_mha_fwd")) == (0, 3)


def test_a_step_that_cannot_fit_is_one_line_and_exit_code_1():
    """The command, as a user runs it: a batch no v5p chip holds; the JSON line says so, then one error line."""
    command = [sys.executable, "-m", "bert_jax.compile_check", "--config=configs/bert.py:tiny", "--topology=v5p-8",
               "--eval_step=false", "--config.data.batch_size=1048576", "--config.mesh.data=4"]
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # the command sets up its own environment
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 1, result.stderr[-2000:]
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["fits"] is False and row["per_chip_gb"] > row["hbm_gb"]
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "does not fit" in error[0], result.stderr
    fits = re.search(r"config.data.batch_size=(\d+) \((\d+) a chip", error[0])
    assert fits and int(fits.group(1)) == 4 * int(fits.group(2)) < 1048576, error[0]
    assert "remat_policy" in error[0] and "scan_layers=true" in error[0] and "Traceback" not in result.stderr


def test_attention_dropout_runs_in_bert_jaxs_kernel_in_the_tpu_step():
    """With the papers' attention dropout, "auto" on TPU runs bert_jax's flash kernel with dropout (Mosaic lowers
    its uint32 hash) instead of the reference attention: no [.., S, S] array, and its FLOPs join the estimate."""
    config = small_bert()
    config.model.attention_probs_dropout_prob = 0.1
    compiled = compile_step(config)
    hlo = compiled.step.as_text()
    assert "bert_jax_flash_fwd" in hlo and "bert_jax_flash_bwd" in hlo and "splash_mha" not in hlo
    assert not [s for s in audit.activation_shapes(hlo, rank=4) if s[-2:] == (SEQ, SEQ)]
    row = compile_check.report(compiled)
    assert row["attention"] == "splash" and row["splash_flops"] > 0 and row["est_step_s"] > row["compiler_step_s"]
