"""Fits-and-speed table for TPU pod slices, from the compiler alone (bert_jax.compile_check; no TPU needed).

    python benchmarks/tpu_compile.py [--rows=bert-large-512@v5p-8,...] [--out=benchmarks/tpu_compile.jsonl]
    python benchmarks/tpu_compile.py --rows=bert-large-512@v5p-8:72   # that batch per chip only, no search
                                       # (the table then gives the largest batch its memory predicts)
    python benchmarks/tpu_compile.py --confirm [--rows=...]          # then compile those predicted batches
    python benchmarks/tpu_compile.py --layout=auto|scanned|unscanned   # auto (default): both, and which to train

Per row (a paper-size preset at a paper sequence length on a topology) it finds the largest batch per chip that
fits in few compiles: one compile at a probe batch gives the memory as fixed + per-example (the temporaries scale with
the batch), the batch that model predicts is compiled to confirm it (and cut by 15% once if the compiler refuses).
Each finished row is appended to --out as a JSON line, so a rerun continues with the rows still missing (delete a
row's line to redo it). `--confirm` takes the rows compiled at a given batch as the search's probe and compiles the
batch each one's memory predicts; the row it finds is appended, and replaces the given one. Then it prints the
markdown table of docs/tpu.md and ends with one JSON line.

`--layout=auto` compiles every row with scanned layers and unscanned (ModernBERT, whose layers differ, unscanned
only), reports both, and recommends, in one line a row, the faster layout that fits, each at the largest batch it
fits: time, memory and batch of a row are always those of the one program it trains. Where the cycle sums (the
slow end of the estimate's range) rank the layouts the other way, the line ends "unsettled".

Every step time, MFU and day count is the compiler's estimate (its cost model, plus the splash kernels' FLOPs at
peak), not a measurement. Each compile takes minutes of CPU; the whole table takes hours: run it in the background.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from bert_jax import compile_check  # noqa: E402

compile_check.set_deviceless_environment()

from bert_jax import config_lib, families  # noqa: E402

# The papers' schedules, in tokens seen (steps x batch x sequence length), for the days column:
# BERT (Devlin et al. 2018, A.2): 1M steps of 256 sequences, 90% at 128 tokens, 10% at 512.
# RoBERTa (Liu et al. 2019, Table 3): 500K steps of 8K sequences of 512. ALBERT (Lan et al. 2019, 4.1): 125K steps of
# 4096 x 512. ELECTRA-Large (Clark et al. 2020, Table 8): 400K steps of 2048 x 512.
# ModernBERT (Warner et al. 2024, 2.2): 1.7T tokens at 1024, then 250B at 8192 and a 50B-token decay.
SCHEDULE_TOKENS = {
    ("bert", 128): 0.9e6 * 256 * 128, ("bert", 512): 0.1e6 * 256 * 512,
    ("roberta", 512): 500e3 * 8192 * 512, ("albert", 512): 125e3 * 4096 * 512, ("electra", 512): 400e3 * 2048 * 512,
    ("modernbert", 1024): 1.7e12, ("modernbert", 8192): 300e9,
}
PRESETS = [("bert", "base", 128), ("bert", "base", 512), ("bert", "large", 128), ("bert", "large", 512),
           ("roberta", "large", 512), ("albert", "xxlarge", 512), ("electra", "large", 512),
           ("modernbert", "base", 1024), ("modernbert", "base", 8192), ("modernbert", "large", 1024),
           ("modernbert", "large", 8192)]
TOPOLOGIES = ["v5p-8", "v5e-8", "v5p-64"]
PROBE_TOKENS = 32 * 512  # per chip, at the probe compile


LAYOUTS = {"auto": ("scanned", "unscanned"), "scanned": ("scanned",), "unscanned": ("unscanned",)}


def base_name(family: str, size: str, seq: int, topology: str) -> str:
    return f"{family}-{size}-{seq}@{topology}"


def row_name(family: str, size: str, seq: int, topology: str, layout: str) -> str:
    return f"{base_name(family, size, seq, topology)}/{layout}"


def layouts(family: str, size: str, choice: str) -> tuple[str, ...]:
    """The layer layouts --layout compiles for a preset: never scanned where the family's layers differ."""
    scans = families.of(config_lib.load_preset(family, size).model).scans_layers
    return tuple(layout for layout in LAYOUTS[choice] if scans or layout == "unscanned")


def table_config(family: str, size: str, seq: int, topology: compile_check.Topology, layout: str,
                 attention_dropout: float, batch_per_chip: int):
    """The preset as the table trains it: bfloat16 compute, the given attention dropout (0: splash; the papers' 0.1:
    bert_jax's flash kernel with dropout) and layer layout, a data-parallel mesh (FSDP over the slice where a chip's
    HBM holds less than 32 GiB), masking's predictions scaled to the length."""
    config = config_lib.load_preset(family, size)
    config.model.dtype = "bfloat16"
    config.model.attention_probs_dropout_prob = attention_dropout
    config.model.scan_layers = layout == "scanned"
    config.data.seq_length = seq
    config.data.batch_size = batch_per_chip * topology.chips
    config.masking.max_predictions_per_seq = math.ceil(seq * config.masking.rate)
    small_hbm = topology.chip.hbm_gib < 32
    config.mesh.data, config.mesh.fsdp = (1, -1) if small_hbm else (-1, 1)
    return config


def compile_row(family, size, seq, topology, layout, attention_dropout, batch_per_chip) -> dict:
    config = table_config(family, size, seq, topology, layout, attention_dropout, batch_per_chip)
    row = compile_check.report(compile_check.compile_program(config, topology, with_eval=False))
    print(f"  batch {batch_per_chip}/chip: fits {row['fits']}, {row.get('per_chip_gb') or 0:.1f} GB, "
          f"step {(row.get('est_step_s') or 0) * 1e3:.0f} ms, MFU {row.get('est_mfu') or 0:.2f} "
          f"({row['compile_s']} s to compile)", flush=True)
    return row


def largest_batch(family, size, seq, topology, layout, attention_dropout) -> dict:
    """The row of the largest batch per chip found to fit (see the module docstring)."""
    row_args = (family, size, seq, topology, layout, attention_dropout)
    probe = max(1, PROBE_TOKENS // seq)
    row = compile_row(*row_args, probe)
    while not row["fits"] and probe > 1:
        probe //= 2
        row = compile_row(*row_args, probe)
    return confirmed_largest(*row_args, row) if row["fits"] else row


def confirmed_largest(family, size, seq, topology, layout, attention_dropout, row: dict) -> dict:
    """From a compiled row that fits: the row of the batch its memory predicts, compiled (or of 85% of it when the
    compiler refuses that), or `row` itself when neither is larger or fits."""
    predicted = compile_check.predicted_largest_batch(row)
    for batch in (predicted, int(predicted * 0.85)):
        if batch <= row["batch_per_chip"]:
            break
        candidate = compile_row(family, size, seq, topology, layout, attention_dropout, batch)
        if candidate["fits"]:
            return candidate
    return row


def attention_label(row: dict) -> str:
    """The attention column: the kernel; for attention_impl=splash, the Pallas kernels the preset's layers run
    (transformer.tpu_kernel): "flash" (bert_jax's) or "splash" (Pallas')."""
    dropout = row.get("attention_dropout") or 0.0
    suffix = f", dropout {dropout:g}" if dropout else ""
    if row["attention"] != "splash":
        return row["attention"] + suffix
    model = config_lib.load_preset(*row["preset"].split("-", 1)).model
    model.attention_probs_dropout_prob = dropout
    kernels = dict.fromkeys(kernel for _, kernel in compile_check.layer_attention(model))
    return " + ".join(kernels) + suffix


def markdown(rows: list[dict]) -> str:
    lines = ["| preset | seq | topology | mesh (data, fsdp, tensor) | layers | batch / chip | HBM / chip | attention | "
             "est. step | est. MFU | est. days, paper schedule |", "|" + "---|" * 11]
    for row in rows:
        mesh = ",".join(str(row["mesh"][axis]) for axis in ("data", "fsdp", "tensor"))
        layout = "scanned" if row["scan_layers"] else "unscanned"
        head = f"| {row['preset']} | {row['seq_length']} | {row['topology']} | {mesh} | {layout} | "
        if not row["fits"]:
            lines.append(head + "none fits | | | | | |")
            continue
        batch = f"{row['batch_per_chip']:g}"
        if row.get("batch_given"):
            batch += f" (given; memory predicts {compile_check.predicted_largest_batch(row)})"
        timing = "no estimate (the cost model's time is negative) | | |"
        if row["est_step_s"]:
            floor = f"{compile_check.FLOPS_FLOOR}; " if row.get("est_floored") else ""
            cycles = f"{row['est_step_cycles_s'] * 1e3:.0f} at the cycle sum"
            timing = (f"{row['est_step_s'] * 1e3:.0f} ms ({floor}{cycles}) | "
                      f"{row['est_mfu']:.2f} | {row['paper_days']:.2g} |")
        lines.append(head + f"{batch} | {row['per_chip_gb']:.1f} of {row['hbm_gb']:.1f} GB | {attention_label(row)} | "
                     + timing)
    return "\n".join(lines)


def recommendation(rows: list[dict]) -> str:
    """One line: of a row's layouts, the one that fits and trains the most tokens a second (the compiler's
    estimate), each at its own batch; the larger batch where the cost model gives no time. Where the cycle sums, the
    range's slow end, rank the layouts the other way, the line says so: a loop's `optimal_seconds` is scaled, not
    counted (ELECTRA-large scanned at 208 a chip: est. MFU 1.00 by it, floored at the model's FLOPs at peak, 0.44 by
    its cycles; docs/tpu.md), so only a TPU settles that choice."""
    fitting = [row for row in rows if row["fits"]]
    if not fitting:
        return f"{rows[0]['base_name']}: no layout fits"
    rate = lambda seconds: lambda row: row["batch_per_chip"] / row[seconds] if row.get(seconds) else 0
    best = max(fitting, key=lambda row: (rate("est_step_s")(row), row["batch_per_chip"]))
    layout = lambda row: "scanned" if row["scan_layers"] else "unscanned"
    floored = lambda row: f" ({compile_check.FLOPS_FLOOR})" if row.get("est_floored") else ""
    figures = lambda row: (f"{layout(row)} at {row['batch_per_chip']:g} a chip, {row['per_chip_gb']:.1f} GB"
                           + (f", est. {row['est_step_s'] * 1e3:.0f} ms{floored(row)}, MFU {row['est_mfu']:.2f}"
                              if row["est_step_s"] else ""))
    others = "; ".join(figures(row) for row in rows if row is not best)
    line = f"{best['base_name']}: train {figures(best)}" + (f" (against {others})" if others else "")
    by_cycles = rate("est_step_cycles_s")
    slow_end_best = max(fitting, key=by_cycles)
    if by_cycles(slow_end_best) > by_cycles(best):
        line += (f"; unsettled: by the cycle sums {layout(slow_end_best)} is faster "
                 f"({slow_end_best['est_step_cycles_s'] * 1e3:.0f} against {best['est_step_cycles_s'] * 1e3:.0f} ms)")
    return line


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="", help="comma-separated family-size-seq@topology[:batch per chip] "
                        "(default: the table, each row's batch searched)")
    parser.add_argument("--out", default="benchmarks/tpu_compile.jsonl")
    parser.add_argument("--confirm", action="store_true", help="for the rows in --out compiled at a given batch, "
                        "compile the batch their memory predicts (the search's second step) and append that row")
    parser.add_argument("--layout", default="auto", choices=tuple(LAYOUTS), help="scanned or unscanned layers, or "
                        "auto: both, and a recommendation between them")
    parser.add_argument("--attention_dropout", type=float, default=0.0,
                        help="attention-probability dropout (the papers' 0.1 runs bert_jax's flash kernel)")
    args = parser.parse_args()
    bases = [(f, s, q, t) for t in TOPOLOGIES for f, s, q in PRESETS]
    batches = {}
    if args.rows:
        names, _, given = zip(*(row.partition(":") for row in args.rows.split(",")))
        batches = {name: int(batch) for name, batch in zip(names, given) if batch}
        bases = sorted((b for b in bases if base_name(*b) in names), key=lambda b: names.index(base_name(*b)))
    wanted = [(*base, layout) for base in bases for layout in layouts(base[0], base[1], args.layout)]
    done = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            done = {row["name"]: row for row in map(json.loads, f)}
    suffix = f"+dropout{args.attention_dropout:g}" if args.attention_dropout else ""
    for family, size, seq, topology_name, layout in wanted:
        base, name = base_name(family, size, seq, topology_name), row_name(family, size, seq, topology_name, layout)
        name += suffix
        to_confirm = args.confirm and name in done and done[name]["batch_given"] and done[name]["fits"]
        if name in done and not to_confirm:
            continue
        print(f"{name}:", flush=True)
        topology = compile_check.parse_topology(topology_name)
        row_args = (family, size, seq, topology, layout, args.attention_dropout)
        if name in done:  # --confirm: a later line of the same name replaces the row (see `done` above)
            row = confirmed_largest(*row_args, done[name])
            if row is done[name]:
                print(f"  batch {row['batch_per_chip']:g}/chip stays: no larger one is predicted to fit, or fits",
                      flush=True)
                continue
        elif base in batches:
            row = compile_row(*row_args, batches[base])
        else:
            row = largest_batch(*row_args)
        row.update(name=name, base_name=base + suffix, preset=f"{family}-{size}",
                   batch_given=base in batches and not to_confirm,
                   attention_dropout=args.attention_dropout)
        if row["fits"] and row["est_step_s"]:
            tokens_per_s = row["est_tokens_per_s_per_chip"] * row["chips"]
            row["paper_days"] = SCHEDULE_TOKENS[(family, seq)] / tokens_per_s / 86400
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        done[name] = row
    rows = [done[row_name(*w) + suffix] for w in wanted if row_name(*w) + suffix in done]
    print(markdown(rows))
    for base in dict.fromkeys(row["base_name"] for row in rows):
        print("recommend " + recommendation([row for row in rows if row["base_name"] == base]))
    print(json.dumps({row["name"]: {key: row.get(key) for key in ("fits", "batch_per_chip", "per_chip_gb", "hbm_gb",
                                                                  "est_step_s", "est_step_cycles_s", "est_mfu",
                                                                  "paper_days")}
                      for row in rows}))


if __name__ == "__main__":
    main()
