"""What each mesh layout costs: compile the real train step on 8 fake CPU devices and read its HLO.

    python benchmarks/sharding.py [--models=bert-base,bert-large] [--batch=32] [--seq=128]
    python benchmarks/sharding.py --presets   # does every preset lower on (1,1,8) and (1,2,4)?

Per model and mesh (data, fsdp, tensor), also with sequence parallelism ("sp") and with scanned layers ("scan"),
it prints the collectives XLA put in one step (count and bytes per device, by kind), the textbook pattern's bytes
for that layout (bert_jax.sharding_audit) and their ratio, both also as bytes on the wire (an all-reduce moves twice
its size on a ring), and the temp memory per device. A mesh the model's sizes cannot split over is reported with the
config check's message. Ends with one JSON line. Compiling on CPU measures the layout, not the speed of any
accelerator; bert_jax.compile_check and benchmarks/tpu_compile.py read the same from XLA:TPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from bert_jax import config_lib, families, sharding, train  # noqa: E402
from bert_jax import sharding_audit as audit  # noqa: E402

MESHES = [(8, 1, 1), (1, 8, 1), (1, 1, 8), (2, 2, 2), (1, 2, 4)]
# (mesh, variant): every mesh as configured, then sequence parallelism on the tensor meshes and scanned layers
# (FSDP then gathers one layer's parameters at a time) on the data and fsdp meshes.
LAYOUTS = ([(m, "") for m in MESHES] + [(m, "sp") for m in [(1, 1, 8), (1, 2, 4)]]
           + [(m, "scan") for m in [(8, 1, 1), (1, 8, 1)]])


def step_config(family: str, size: str, mesh_shape, batch: int, seq: int, variant: str = ""):
    config = config_lib.load_preset(family, size)
    config.data.batch_size, config.data.seq_length = batch, seq
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh_shape
    config.mesh.sequence_parallel = variant == "sp"
    config.model.scan_layers = variant == "scan"
    return config


def measure(config) -> dict:
    """One row: collectives, ideal, temp memory and compile time of the train step on config.mesh."""
    shape = (config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    variant = "sp" if config.mesh.sequence_parallel else "scan" if config.model.scan_layers else ""
    row = {"mesh": f"{'x'.join(map(str, shape))} {variant}".strip()}
    mesh = sharding.make_mesh(*shape)
    try:
        train.validate(config, mesh)
    except sharding.MeshError as error:
        return {**row, "error": str(error)}
    program = train.build_program(config, mesh)
    started = time.perf_counter()
    compiled = program.step.lower(program.abstract_state, train.abstract_batch(config, mesh)).compile()
    hlo = compiled.as_text()
    stats = audit.collective_stats(hlo)
    ideal = audit.ideal_bytes(config, mesh, program.state_shardings["params"], program.abstract_state["params"])
    return {**row, "compile_s": round(time.perf_counter() - started, 1),
            "collectives": {k: v for k, v in stats.items() if v["count"]},
            "collective_gb": audit.total_bytes(stats) / 1e9, "ideal_gb": sum(ideal.values()) / 1e9,
            "ratio_to_ideal": audit.total_bytes(stats) / max(1, sum(ideal.values())),
            "wire_gb": audit.wire_bytes(stats) / 1e9, "ideal_wire_gb": audit.ideal_wire_bytes(config, ideal) / 1e9,
            "temp_gb": compiled.memory_analysis().temp_size_in_bytes / 1e9,
            "donated": audit.donated_inputs(hlo) == len(jax.tree.leaves(program.abstract_state))}


def print_row(model: str, row: dict) -> None:
    if "error" in row:
        print(f"{model:12s} {row['mesh']:9s} does not fit: {row['error']}")
        return
    kinds = ", ".join(f"{k} {v['count']} / {v['bytes'] / 1e9:.3f} GB" for k, v in row["collectives"].items())
    print(f"{model:12s} {row['mesh']:9s} {row['collective_gb']:7.3f} GB (ideal {row['ideal_gb']:.3f}, "
          f"x{row['ratio_to_ideal']:.2f}; wire {row['wire_gb']:.3f} GB, ideal {row['ideal_wire_gb']:.3f})  "
          f"temp {row['temp_gb']:.2f} GB  donated {row['donated']}  "
          f"compile {row['compile_s']} s  [{kinds}]", flush=True)


def check_presets(seq: int) -> dict:
    """Whether every preset's step lowers (shardings resolved, no IndivisibleError) on the tensor meshes."""
    results = {}
    for family in families.names():
        for size in families.get(family).sizes:
            for mesh_shape in [(1, 1, 8), (1, 2, 4)]:
                config = step_config(family, size, mesh_shape, batch=8, seq=seq)
                mesh = sharding.make_mesh(*mesh_shape)
                name = f"{family}-{size} {'x'.join(map(str, mesh_shape))}"
                try:
                    train.validate(config, mesh)
                    program = train.build_program(config, mesh)
                    program.step.lower(program.abstract_state, train.abstract_batch(config, mesh))
                    results[name] = "lowers"
                except sharding.MeshError as error:
                    results[name] = f"refused: {error}"
                print(f"{name:28s} {results[name]}", flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="bert-base,bert-large")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--presets", action="store_true", help="only check that every preset lowers on tensor meshes")
    args = parser.parse_args()
    if args.presets:
        print(json.dumps({"presets": check_presets(args.seq)}))
        return
    rows = {}
    print(f"train step, batch {args.batch} x {args.seq}, float32, 8 CPU devices; bytes per device and step")
    for model in args.models.split(","):
        family, size = model.split("-")
        rows[model] = []
        for mesh_shape, variant in LAYOUTS:
            row = measure(step_config(family, size, mesh_shape, args.batch, args.seq, variant))
            print_row(model, row)
            rows[model].append(row)
    print(json.dumps({"batch": args.batch, "seq": args.seq, "rows": rows}))


if __name__ == "__main__":
    main()
