"""The families' comparison at equal compute: pretrain BERT, RoBERTa, ALBERT, ELECTRA and ModernBERT on one corpus
with the same training FLOPs, fine-tune each on SST-2, MRPC, STS-B, RTE and CoLA, and write a table and plots.

    python -m bert_jax.experiments.compare --budget=cpu-small --workdir=runs/compare \\
        [--corpus='data/corpus/*.txt'] [--glue=tfds:glue] [--results_dir=results]

--glue names GLUE once for all tasks (bert_jax.data_sources): tfds:glue (the default: TFDS glue/<task>, built with
`tfds build glue/sst2 glue/mrpc glue/stsb glue/rte glue/cola`), the hub's nyu-mll/glue as `hf download` leaves it,
or a folder of GLUE task folders (SST-2/, RTE/, ... of TSVs). A task missing there fails before any training, with
the command that fetches it. Every folder and the corpus may also be in a bucket (gs://...), e.g.
--workdir=gs://bucket/compare on a pod.

Budgets are the presets of configs/compare.py. Stages, each resumable (rerun the command to continue):
1. corpus: the raw text -> DIR/corpus/text (one sentence per line, bert_jax.input_pipeline.plain_text), tokenized
   once per tokenizer into DIR/corpus/<tokenizer>;
2. pretraining: DIR/pretrain/<family> with bert_jax.train; total_steps = budget FLOPs // model FLOPs of a step;
3. fine-tuning: DIR/finetune/<family>/<step>/<task>/seed<k> with bert_jax.finetune from the pretraining checkpoint
   at each of the budget's glue_points (fractions of the budget), for every seed; plus "no pretraining", the BERT
   architecture fine-tuned from its random initialisation. A finished fine-tune keeps results.json and drops its
   checkpoints (nothing reads them again);
4. report: RESULTS_DIR/compare.md (the table, ELECTRA vs BERT, the param_table reproduction), compare.json,
   pretraining_loss.png and glue_vs_flops.png.
Scores follow ELECTRA's convention: Matthews correlation for CoLA, Spearman for STS-B, accuracy for the others,
times 100; the GLUE average is their mean. With several fine-tuning seeds a score is "mean ± half the range".
"""
from __future__ import annotations

import fractions
import io
import json
import math
import sys
import time

import jax
import ml_collections
import numpy as np
from absl import flags
from jax.experimental import multihost_utils

from bert_jax import cli, config_lib, data_sources, families, finetune, flops, native_stderr, param_table, pod
from bert_jax import run_loop, storage
from bert_jax import train as train_lib  # defines --workdir and the distributed flags this command shares
from bert_jax.input_pipeline import config as input_config
from bert_jax.input_pipeline import documents, plain_text, prepare
from bert_jax.metrics_writer import machine_description
from bert_jax.tasks import glue
from bert_jax.workdir import CHECKPOINT_DIR, METRICS_FILE, RESULTS_FILE, SECONDS_FILE

# ELECTRA's convention: one score per task.
TASK_SCORE = {"cola": "dev_mcc", "sst2": "dev_accuracy", "mrpc": "dev_accuracy", "stsb": "dev_spearman",
              "rte": "dev_accuracy", "qnli": "dev_accuracy", "wnli": "dev_accuracy"}
BASELINE = "no pretraining"
BASELINE_RECIPE = "BERT from its random initialisation"

flags.DEFINE_string("budget", "cpu-small", "A budget of configs/compare.py.")
flags.DEFINE_string("corpus", "data/corpus/*.txt", "Comma-separated globs of raw text files to pretrain on (the "
                    "bundled books by default).")
flags.DEFINE_string("glue", "tfds:glue", "GLUE for every task: tfds:glue, the hub's nyu-mll/glue folder, or a folder "
                    "of GLUE task folders (SST-2/, RTE/, ...).")
flags.DEFINE_string("tfds_data_dir", None, "Where TFDS datasets are built (TFDS's default folder if unset).")
flags.DEFINE_string("results_dir", "results", "Where compare.md, compare.json and the plots go.")
flags.DEFINE_integer("seed", 0, "Pretraining seed of every family (fine-tuning seeds come from the budget).")
flags.DEFINE_bool("compile_only", False, "Train nothing: compile every family's train step of the budget for "
                  "--topology (bert_jax.compile_check; no TPU needed) and print the estimated TPU-hours.")
flags.DEFINE_string("topology", "", "With --compile_only: the TPU slice, e.g. v5p-8 (bert_jax.compile_check).")
flags.DEFINE_integer("num_slices", 1, "With --compile_only: slices of that topology in a multislice job.")


# ------------------------------------------------------------------------------------------------------------------
# Configs: one pretraining config per family, one fine-tuning config per (checkpoint, task, seed).
# ------------------------------------------------------------------------------------------------------------------


def pretraining_config(family: str, budget: ml_collections.ConfigDict, prepared_dir: str,
                       seed: int) -> ml_collections.ConfigDict:
    """The family's tiny preset (its objective, masking, tokenizer, optimizer) in the budget's shape and FLOPs."""
    config = ml_collections.ConfigDict(config_lib.load_preset(family, "tiny").to_dict())
    shape = budget.model
    spec = families.get(family)
    config.model.update(hidden_size=shape.hidden_size, num_hidden_layers=shape.num_hidden_layers,
                        num_attention_heads=shape.num_attention_heads, intermediate_size=shape.intermediate_size,
                        embedding_size=shape.embedding_size if spec.factorized_embeddings else shape.hidden_size,
                        num_hidden_groups=1 if spec.shared_layers else shape.num_hidden_layers,
                        dtype=budget.dtype)
    if spec.has_generator:
        width = lambda n: max(1, round(n * shape.generator_fraction))
        config.model.generator.update(hidden_size=width(shape.hidden_size),
                                      num_attention_heads=width(shape.num_attention_heads),
                                      intermediate_size=width(shape.intermediate_size),
                                      num_hidden_layers=shape.num_hidden_layers)
    config_lib.validate_model_config(config.model, needs_generator=config.objective == "rtd")
    config.data.update(prepared_dir=prepared_dir, input_files="", seq_length=budget.seq_length,
                       batch_size=budget.batch_size)
    config.masking.max_predictions_per_seq = math.ceil(budget.seq_length * config.masking.rate)
    config.seed = seed
    grid = checkpoint_grid(budget.glue_points)
    steps = int(budget.pretrain_flops // flops.train_step_flops(config)) // grid * grid
    if steps < grid:
        raise config_lib.ConfigError(f"budget {budget.budget}: {budget.pretrain_flops:.3g} FLOPs give {family} fewer "
                                     f"than the {grid} steps its glue_points need; raise pretrain_flops")
    config.update(total_steps=steps, log_every_steps=max(1, steps // 100), eval_every_steps=0,
                  checkpoint_every_steps=steps // grid, keep_checkpoints=grid)
    config.optimizer.update(learning_rate=budget.learning_rates[family], warmup_steps=max(1, steps // 10))
    return config_lib.lock(config)


def recipe(name: str) -> str:
    """How a row of the table was trained: a family's recipe, or the baseline's."""
    if name == BASELINE:
        return BASELINE_RECIPE
    family = families.get(name)
    return f"{family.title}: {family.recipe}"


def checkpoint_grid(points) -> int:
    """Checkpoints every total_steps / grid steps land on every glue point (fractions of the budget): the least
    common denominator of the fractions. total_steps is rounded down to a multiple of it."""
    return math.lcm(*(fractions.Fraction(p).limit_denominator(1000).denominator for p in points))


def checkpoint_steps(total_steps: int, points) -> list[int]:
    """The pretraining steps whose checkpoints are fine-tuned (exact, as total_steps is a multiple of the grid)."""
    return sorted({round(p * total_steps) for p in points})


def finetune_config(task: str, init: storage.Path, seed: int, budget: ml_collections.ConfigDict,
                    glue_source: str, tfds_data_dir: str | None = None) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict(config_lib.load_preset("glue", task).to_dict())
    ft = budget.finetune
    config.update(init=str(init), data_dir=glue.task_data_dir(glue_source, glue.get_task(task)),
                  tfds_data_dir=tfds_data_dir or "", seed=seed,
                  batch_size=ft.batch_size,
                  num_epochs=ft.num_epochs, max_seq_length=ft.max_seq_length,
                  max_train_examples=ft.max_train_examples, checkpoint_every_steps=1_000_000)
    config.optimizer.learning_rate = ft.learning_rate
    return config_lib.lock(config)


# ------------------------------------------------------------------------------------------------------------------
# Stages.
# ------------------------------------------------------------------------------------------------------------------


def on_process_zero(name: str, write_files) -> None:
    """Files every host reads but one must write (a shared workdir): process 0 writes, the others wait for it."""
    if jax.process_index() == 0:
        write_files()
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def prepare_corpus(patterns: str, workdir: storage.Path, compared) -> dict[str, str]:
    """Convert the raw text once, then tokenize it once per tokenizer; returns family -> prepared folder."""
    text_dir = workdir / "corpus" / "text"
    tokenizers = {}
    for family in compared:
        data = config_lib.load_preset(family, "tiny").data
        path = input_config.resolve_path(data.tokenizer_path)
        tokenizers[family] = (data.tokenizer_kind, path, data.lowercase)

    def write_files():
        if not (text_dir / "done").exists():
            plain_text.convert_files(documents.expand_patterns(patterns, "--corpus"), text_dir)
            storage.atomic_write(text_dir / "done", "")
        texts = [str(p) for p in storage.glob(f"{text_dir}/*") if p.name != "done"]
        for kind, path, lowercase in set(tokenizers.values()):
            units = prepare.work_units(texts, prepared_dir(workdir, kind, path), str(path), kind, lowercase,
                                       docs_per_shard=1000)
            prepare.prepare(units, num_workers=1)

    on_process_zero("bert_jax compare: corpus", write_files)
    return {family: str(prepared_dir(workdir, kind, path)) for family, (kind, path, _) in tokenizers.items()}


def prepared_dir(workdir: storage.Path, kind: str, tokenizer: storage.PathLike) -> storage.Path:
    return workdir / "corpus" / f"{kind}-{storage.as_path(tokenizer).name}"


def pretrain(config: ml_collections.ConfigDict, workdir: storage.Path) -> dict:
    """Run (or finish) one family's pretraining; returns what the table needs about it (kept in summary.json, so
    a rerun reports the wall time of the run that did the work)."""
    summary_file = workdir / "summary.json"
    if summary_file.exists():
        return json.loads(summary_file.read_text())
    start = time.perf_counter()
    train_lib.train_and_evaluate(config, str(workdir))
    losses = [(m["step"], m["loss"]) for m in read_jsonl(workdir / METRICS_FILE) if "loss" in m]
    step_flops = flops.train_step_flops(config)
    summary = dict(total_steps=config.total_steps, flops_per_step=step_flops,
                   pretrain_flops=step_flops * config.total_steps,
                   tokens_seen=config.total_steps * config.data.batch_size * config.data.seq_length,
                   seconds=time.perf_counter() - start, loss_curve=[(step * step_flops, loss) for step, loss in losses],
                   final_loss=losses[-1][1])
    if jax.process_index() == 0:
        storage.atomic_write(summary_file, json.dumps(summary))
    return summary


def run_finetune(config: ml_collections.ConfigDict, workdir: storage.Path) -> tuple[dict[str, float], float]:
    """One fine-tune's dev scores and wall seconds; a finished run is read back instead of redone."""
    results_file, seconds_file = workdir / RESULTS_FILE, workdir / SECONDS_FILE
    if not results_file.exists():
        start = time.perf_counter()
        if not finetune.train_and_evaluate(config, str(workdir)):  # stopped by a signal, its checkpoint saved
            raise SystemExit(f"{workdir}: stopped by signal; rerun the same command to continue")
        if jax.process_index() == 0:
            storage.atomic_write(seconds_file, json.dumps(time.perf_counter() - start))
            (workdir / CHECKPOINT_DIR).rmtree(missing_ok=True)
    return json.loads(results_file.read_text()), json.loads(seconds_file.read_text())


def random_init_checkpoint(config: ml_collections.ConfigDict, pretrained_step: storage.Path,
                           path: storage.Path) -> storage.Path:
    """The BERT backbone at its random initialisation (seeded like pretraining), with the run's tokenizer."""
    from bert_jax import modeling
    from bert_jax.pretrained import load_pretrained, save_pretrained

    def write_files():
        if not path.exists():
            pretrained = load_pretrained(pretrained_step, head="backbone")
            params = modeling.init_params(modeling.backbone(pretrained.config), jax.random.key(config.seed))
            pretrained.params = jax.device_get(params)
            save_pretrained(pretrained, path, format="bert_jax")

    on_process_zero("bert_jax compare: random init", write_files)
    return path


def read_jsonl(path: storage.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------------------------------
# Scores, table and plots.
# ------------------------------------------------------------------------------------------------------------------


def task_score(task: str, results: dict[str, float]) -> float:
    return 100 * results[TASK_SCORE[task]]


def summarize_point(runs: dict[str, list[dict]]) -> dict:
    """Per task and for the GLUE average: mean and half-range over seeds (the average is taken per seed)."""
    per_seed = {task: [task_score(task, r) for r in results] for task, results in runs.items()}
    seeds = len(next(iter(per_seed.values())))
    average = [float(np.mean([scores[i] for scores in per_seed.values()])) for i in range(seeds)]
    spread = lambda xs: (float(np.mean(xs)), (max(xs) - min(xs)) / 2)
    return {"tasks": {task: spread(scores) for task, scores in per_seed.items()}, "glue_average": spread(average),
            "per_seed_average": average}


def fmt(mean_spread, seeds: int) -> str:
    mean, half_range = mean_spread
    return f"{mean:.1f} ± {half_range:.1f}" if seeds > 1 else f"{mean:.1f}"


def markdown(report: dict) -> str:
    """compare.md: the setup, the table at the full budget, every scored point, ELECTRA vs BERT, Table 2.1."""
    budget, tasks, seeds = report["budget"], report["budget"]["finetune"]["tasks"], report["finetune_seeds"]
    n = len(seeds)
    head = ["model", "objective", "params", "pretrain FLOPs", "steps", "tokens seen",
            *[glue.get_task(t).name for t in tasks], "GLUE avg"]
    lines = [f"# Equal-compute comparison of the {len(report['rows']) - 1} families: budget `{budget['budget']}`", "",
             f"Produced by `{report['command']}` on {report['date']} ({report['machine']}): "
             f"{report['pretrain_seconds'] / 60:.0f} minutes of pretraining and {report['finetune_seconds'] / 60:.0f} "
             "of fine-tuning.", "",
             f"- Pretraining: {budget['pretrain_flops']:.3g} training FLOPs per family (bert_jax/flops.py model "
             f"FLOPs: 3x the forward matmuls), sequences of {budget['seq_length']}, batches of "
             f"{budget['batch_size']}, seed {report['pretrain_seed']}; corpus: {report['corpus_summary']}.",
             f"- Shape: H={budget['model']['hidden_size']}, {budget['model']['num_hidden_layers']} layers, "
             f"{budget['model']['num_attention_heads']} heads, FFN {budget['model']['intermediate_size']} "
             f"(ModernBERT's GeGLU: three such matrices); ALBERT and ELECTRA E={budget['model']['embedding_size']}; "
             f"ELECTRA's generator at {budget['model']['generator_fraction']:g} of the width.",
             f"- Fine-tuning: lr {budget['finetune']['learning_rate']:g}, batch {budget['finetune']['batch_size']}, "
             f"{budget['finetune']['num_epochs']:g} epochs, max_seq_length {budget['finetune']['max_seq_length']}, "
             f"at most {budget['finetune']['max_train_examples'] or 'all'} training examples per task, seeds "
             f"{list(seeds)} at the full budget and {seeds[0]} at earlier points; dev scores (CoLA MCC, STS-B "
             "Spearman, accuracy elsewhere) x 100" + (", mean ± half the range over seeds." if n > 1 else "."), "",
             "## At the full budget", "", "| " + " | ".join(head) + " |",
             "|---|---|" + "---:|" * (len(head) - 2)]
    for name, row in report["rows"].items():
        final = row["points"][-1]
        pre = row.get("pretraining")
        cells = [name, recipe(name), f"{row['params'] / 1e6:.2f}M",
                 f"{pre['pretrain_flops']:.3g}" if pre else "0", str(pre["total_steps"]) if pre else "0",
                 f"{pre['tokens_seen'] / 1e6:.2f}M" if pre else "0",
                 *[fmt(final["scores"]["tasks"][t], len(final["seeds"])) for t in tasks],
                 fmt(final["scores"]["glue_average"], len(final["seeds"]))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## GLUE average at each scored point", "", "| model | step | pretrain FLOPs | seeds | GLUE avg |",
              "|---|---:|---:|---:|---:|"]
    for name, row in report["rows"].items():
        for point in row["points"]:
            lines.append(f"| {name} | {point['step']} | {point['flops']:.3g} | {len(point['seeds'])} | "
                         f"{fmt(point['scores']['glue_average'], len(point['seeds']))} |")
    lines += ["", "## Pretraining", "", "| model | final training loss | wall time |", "|---|---:|---:|"]
    for name, row in report["rows"].items():
        if row.get("pretraining"):
            lines.append(f"| {name} | {row['pretraining']['final_loss']:.3f} | "
                         f"{row['pretraining']['seconds'] / 60:.1f} min |")
    lines += ["", "Losses are not comparable across families: the objectives differ (ELECTRA's is the generator's "
              "MLM loss plus 50x the discriminator's; ModernBERT masks 30% of the tokens) and so do the tokenizers "
              "(BERT and ELECTRA: the 30k bert-base-uncased WordPiece; RoBERTa, ModernBERT and ALBERT: 8k byte-BPE "
              "and sentencepiece vocabularies trained on the bundled sample corpus).", "",
              "![pretraining loss](pretraining_loss.png)",
              "![GLUE average against FLOPs](glue_vs_flops.png)", "", "## ELECTRA against BERT at equal compute", "",
              electra_vs_bert(report), "", "## Table 2.1: parameter counts of every preset", "",
              param_table.markdown(param_table.rows()), ""]
    return "\n".join(lines)


def electra_vs_bert(report: dict) -> str:
    """The plain statement the issue asks for: is ELECTRA above BERT at the full budget, and by more than noise?"""
    electra, bert = (report["rows"][f]["points"][-1]["scores"] for f in ("electra", "bert"))
    (e_mean, e_spread), (b_mean, b_spread) = electra["glue_average"], bert["glue_average"]
    above = e_mean > b_mean
    verdict = ("Reproduced: " if above else "Not reproduced: ") + (
        f"ELECTRA's GLUE average {e_mean:.2f} is {'above' if above else 'not above'} BERT's {b_mean:.2f} at the "
        "same pretraining FLOPs")
    if len(report["finetune_seeds"]) < 2:
        verdict += " (one fine-tuning seed: no spread to tell the gap from noise)"
    elif e_mean - e_spread > b_mean + b_spread or b_mean - b_spread > e_mean + e_spread:
        verdict += "; the fine-tuning seed ranges do not overlap"
    else:
        verdict += "; the seed ranges overlap, so at this scale the gap is within fine-tuning noise"
    return verdict + "."


def save_png(fig, path: storage.Path) -> None:
    """savefig through the path layer (matplotlib writes local files only), whole or not at all."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    storage.atomic_write(path, png.getvalue())


def plot(report: dict, results_dir: storage.Path) -> None:
    """pretraining_loss.png (one panel per family) and glue_vs_flops.png (one line per model)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    pretrained = {name: row for name, row in report["rows"].items() if row.get("pretraining")}
    fig, axes = plt.subplots(1, len(pretrained), figsize=(4 * len(pretrained), 3.2), squeeze=False)
    for ax, (name, row) in zip(axes[0], pretrained.items()):
        x, y = zip(*row["pretraining"]["loss_curve"])
        ax.plot(x, y)
        ax.set(title=name, xlabel="training FLOPs", ylabel="training loss")
    fig.tight_layout()
    save_png(fig, results_dir / "pretraining_loss.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, row in report["rows"].items():
        x = [p["flops"] for p in row["points"]]
        means, spreads = zip(*[p["scores"]["glue_average"] for p in row["points"]])
        ax.errorbar(x, means, yerr=spreads, marker="o", capsize=3, label=name)
    ax.set(xlabel="pretraining FLOPs", ylabel="GLUE dev average", title=f"budget {report['budget']['budget']}")
    ax.legend()
    fig.tight_layout()
    save_png(fig, results_dir / "glue_vs_flops.png")
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------------------
# The experiment, top to bottom.
# ------------------------------------------------------------------------------------------------------------------


def run(budget_name: str, workdir: storage.PathLike, corpus: str, glue_source: storage.PathLike,
        results_dir: storage.PathLike, seed: int = 0, tfds_data_dir: str | None = None) -> dict:
    """Every stage; returns the report that compare.json holds. The folders may be local or in a bucket."""
    start = time.perf_counter()
    workdir, results_dir, glue_source = storage.as_path(workdir), storage.as_path(results_dir), str(glue_source)
    budget = config_lib.load_preset("compare", budget_name)
    compared = [f for f in families.names() if f in budget.learning_rates]
    glue.check_tasks([glue.get_task(t) for t in budget.finetune.tasks], glue_source, tfds_data_dir, "--glue")
    if jax.process_index() == 0:
        storage.check_writable(results_dir)  # now, not after hours of training
    train_lib.enable_compilation_cache(str(workdir / "xla_cache"))  # fine-tunes of one shape compile once
    prepared = prepare_corpus(corpus, workdir, compared)
    configs = {f: pretraining_config(f, budget, prepared[f], seed) for f in compared}
    rows = {}
    for family, config in configs.items():
        run_loop.announce("== pretraining %s: %d steps of %.3g FLOPs", family, config.total_steps,
                           flops.train_step_flops(config))
        rows[family] = {"pretraining": pretrain(config, workdir / "pretrain" / family),
                        "params": param_table.backbone_params(config.model)}
    inits = {family: [(step, step * rows[family]["pretraining"]["flops_per_step"],
                       workdir / "pretrain" / family / CHECKPOINT_DIR / str(step))
                      for step in checkpoint_steps(config.total_steps, budget.glue_points)]
             for family, config in configs.items()}
    first_bert_step = inits["bert"][0][2]
    rows[BASELINE] = {"params": rows["bert"]["params"]}
    inits[BASELINE] = [(0, 0.0, random_init_checkpoint(configs["bert"], first_bert_step,
                                                       workdir / "random_init" / "bert"))]
    finetune_seconds = 0.0
    for name, points in inits.items():
        rows[name]["points"] = []
        for step, point_flops, init in points:
            # Every seed at the full budget; the first seed alone at the earlier points of the curve.
            seeds = budget.finetune.seeds if step == points[-1][0] else budget.finetune.seeds[:1]
            runs = {}
            for task in budget.finetune.tasks:
                runs[task] = []
                for ft_seed in seeds:
                    run_loop.announce("== fine-tuning %s (step %d) on %s, seed %d", name, step, task, ft_seed)
                    run_dir = workdir / "finetune" / name.replace(" ", "_") / str(step) / task / f"seed{ft_seed}"
                    results, seconds = run_finetune(finetune_config(task, init, ft_seed, budget, glue_source,
                                                                   tfds_data_dir), run_dir)
                    runs[task].append(results)
                    finetune_seconds += seconds
            rows[name]["points"].append({"step": step, "flops": point_flops, "seeds": list(seeds), "runs": runs,
                                         "scores": summarize_point(runs)})
    report = {"budget": budget.to_dict(), "pretrain_seed": seed, "finetune_seeds": list(budget.finetune.seeds),
              "corpus": corpus, "corpus_summary": corpus_summary(prepared), "rows": rows,
              "seconds": time.perf_counter() - start, "finetune_seconds": finetune_seconds,
              "pretrain_seconds": sum(rows[f]["pretraining"]["seconds"] for f in compared),
              "date": time.strftime("%Y-%m-%d"),
              "machine": f"{machine_description()}, JAX on {jax.devices()[0].platform}",
              "command": f"python -m bert_jax.experiments.compare --budget={budget_name} --workdir=DIR"}
    if jax.process_index() == 0:
        storage.atomic_write(results_dir / "compare.json", json.dumps(report, indent=1))
        storage.atomic_write(results_dir / "compare.md", markdown(report))
        plot(report, results_dir)
    return report


def corpus_summary(prepared: dict[str, str]) -> str:
    """Documents and tokens of the corpus under each tokenizer, from prepare's markers."""
    parts = []
    for path in sorted(set(prepared.values())):
        counts = [json.loads(p.read_text()) for p in storage.glob(f"{path}/*.done.json")]
        parts.append(f"{sum(c['documents'] for c in counts):,} documents, {sum(c['tokens'] for c in counts):,} "
                     f"tokens as {storage.as_path(path).name}")
    return "; ".join(parts)


def compile_budget(budget_name: str, topology_name: str, num_slices: int, seed: int) -> dict:
    """Every family's pretraining step of the budget, compiled for a TPU topology with no TPU and no data: fits,
    the compiler's estimated step time and MFU, and the TPU-hours (chips x estimated time) its steps would take."""
    from bert_jax import compile_check

    compile_check.set_deviceless_environment(topology_name)
    budget = config_lib.load_preset("compare", budget_name)
    topology = compile_check.parse_topology(topology_name, num_slices)
    rows = {}
    for family in [f for f in families.names() if f in budget.learning_rates]:
        run_loop.announce("== %s: compiling %s's train step for %s", budget_name, family, topology.name)
        config = pretraining_config(family, budget, prepared_dir="", seed=seed)
        try:
            row = compile_check.check(config, topology, with_eval=False)
        except compile_check.DoesNotFit as error:
            rows[family] = {"fits": False, "error": str(error)}
            continue
        rows[family] = {**{k: row[k] for k in ("fits", "per_chip_gb", "est_step_s", "est_mfu", "total_steps")},
                        "est_tpu_hours": row["est_step_s"] and row["est_step_s"] * config.total_steps * topology.chips
                        / 3600}
    return rows


def main(argv):
    del argv
    f = flags.FLAGS
    if f.compile_only:
        if not f.topology:
            raise config_lib.ConfigError("--compile_only needs --topology (a TPU slice such as v5p-8)")
        rows = compile_budget(f.budget, f.topology, f.num_slices, f.seed)
        print(json.dumps({"budget": f.budget, "topology": f.topology, "num_slices": f.num_slices, "rows": rows}))
        return
    if not cli.verbose():
        native_stderr.start()
    if f.coordinator_address or f.distributed:
        pod.start(f.coordinator_address, f.num_processes, f.process_id, config_lib.PEER_TIMEOUT_S)
    glue_source = f.glue if data_sources.tfds_name(f.glue) else input_config.resolve_path(f.glue)
    report = run(f.budget, f.workdir, f.corpus, glue_source, f.results_dir, f.seed, f.tfds_data_dir)
    summary = {name: row["points"][-1]["scores"]["glue_average"][0] for name, row in report["rows"].items()}
    print(electra_vs_bert(report))
    print(json.dumps({"budget": f.budget, "glue_average": summary, "minutes": report["seconds"] / 60}))


if __name__ == "__main__":
    if any(arg.startswith("--compile_only") for arg in sys.argv[1:]):
        flags.FLAGS.set_default("workdir", "")  # bert_jax.train's --workdir is required; compiling writes nothing
    cli.run(main)
