"""Fine-tuning from any pretrained checkpoint: GLUE classification and regression, and SQuAD span extraction.

    python -m bert_jax.finetune --config=configs/glue.py:<task> --workdir=DIR --config.init=PATH
    python -m bert_jax.finetune --config=configs/squad.py:v1.1 --workdir=DIR --config.init=PATH ...

The conventions of pretraining (bert_jax.train) hold: its train step, shardings from the logical-axis rules, Orbax
checkpoints of the whole state (a stopped run resumes where it was), metrics.jsonl + TensorBoard and a progress bar.
Batch i is a pure function of (seed, i): epochs are permutations seeded by (seed, epoch), laid end to end.
At the end every evaluation set is predicted and scored; scores go to metrics.jsonl and results.json, predictions
to predictions/ (GLUE submission TSVs) or predictions.json (SQuAD).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math

import jax
import ml_collections
import numpy as np
import optax
from absl import flags, logging
from flax import linen as nn

from bert_jax import checkpoints, cli, modeling, run_loop, sharding, storage
from bert_jax import optimizer as optimizer_lib
from bert_jax import train as train_lib  # also defines the --workdir, --config and distributed flags used here
from bert_jax import workdir as workdir_lib
from bert_jax.errors import UserError
from bert_jax.evaluation import glue_metrics
from bert_jax.evaluation import squad as squad_eval
from bert_jax.modeling.transformer import padded_vocab_size
from bert_jax.tasks import glue, squad
from bert_jax.tasks.text import encode_texts

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class FinetuneConfigError(UserError, ValueError):
    """A fine-tuning setting that cannot work; the message names the key."""


# ------------------------------------------------------------------------------------------------------------------
# Tasks: each reads its data into features, names its model and loss, and turns predictions into scores and files.
# ------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class EvalSet:
    name: str  # prefixes its scores, e.g. "dev_matched" -> dev_matched_accuracy
    features: dict[str, np.ndarray]
    reference: object  # what scoring needs besides the model outputs: labels (None: unlabelled), SQuAD examples
    predictions_file: str  # relative to the workdir


def classification_loss(outputs, batch):
    logits = outputs["logits"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
    return loss, {"loss": loss, "accuracy": (logits.argmax(-1) == batch["labels"]).mean()}


def regression_loss(outputs, batch):
    loss = ((outputs["logits"][:, 0] - batch["labels"]) ** 2).mean()
    return loss, {"loss": loss}


def span_loss(outputs, batch):
    """Mean of the start and end cross-entropies (BERT's run_squad)."""
    start = optax.softmax_cross_entropy_with_integer_labels(outputs["start_logits"], batch["start_positions"])
    end = optax.softmax_cross_entropy_with_integer_labels(outputs["end_logits"], batch["end_positions"])
    loss = (start.mean() + end.mean()) / 2
    return loss, {"loss": loss}


class GlueTask:
    """One GLUE task from TSV files (config.data_dir) or TFDS; dev sets are scored, test sets only predicted."""

    def __init__(self, config, tokenizer, family: str):
        self.task = glue.get_task(config.task)
        self.regression = self.task.labels is None
        self.loss = regression_loss if self.regression else classification_loss
        self.output_keys = ("logits",)

        def load(split):
            return glue.load_split(self.task, split, config.data_dir, config.tfds_data_dir or None)

        def encode(part: glue.Split, what: str):
            features, truncated = encode_texts(tokenizer, family, part.text_a, part.text_b, config.max_seq_length)
            if truncated:
                logging.warning("%s %s: %d of %d examples are longer than max_seq_length=%d and were truncated",
                                self.task.name, what, truncated, len(part.text_a), config.max_seq_length)
            if part.labels is not None:
                features["labels"] = part.labels
            return features

        self.train_features = encode(first_n(load("train")[0], config.max_train_examples), "train")
        submission_names = glue.submission_names(self.task)
        self.eval_sets = [EvalSet(name, encode(part, name), part.labels, f"predictions/dev/{file}.tsv")
                          for name, file, part in zip(self.task.dev_files, submission_names, load("dev"))]
        test = load("test") if glue.has_test_files(self.task, config.data_dir) else []
        if not test:
            logging.info("no %s test files in %s, so no submission file", self.task.name, config.data_dir)
        self.eval_sets += [EvalSet(name, encode(part, name), None, f"predictions/test/{file}.tsv")
                           for name, file, part in zip(self.task.test_files, submission_names, test)]

    def model(self, model_config) -> nn.Module:
        return modeling.SequenceClassifier(model_config, num_labels=1 if self.regression else len(self.task.labels))

    def finish(self, eval_set: EvalSet, outputs: dict[str, np.ndarray], workdir: storage.Path) -> dict[str, float]:
        """Write the GLUE submission file of this set; score it when it has labels."""
        logits = outputs["logits"]
        predictions = logits[:, 0] if self.regression else logits.argmax(-1)
        if jax.process_index() == 0:
            path = workdir / eval_set.predictions_file
            path.parent.mkdir(parents=True, exist_ok=True)
            glue.write_submission(self.task, predictions, path)
        if eval_set.reference is None:
            return {}
        return glue_metrics.compute(self.task.metrics, predictions, eval_set.reference)


class SquadTask:
    """SQuAD v1.1 / v2.0 from config.data_dir, or config.train_file and config.predict_file."""

    loss = staticmethod(span_loss)
    output_keys = ("start_logits", "end_logits")

    def __init__(self, config, tokenizer, family: str):
        if config.length_bucket:
            raise FinetuneConfigError(f"config.length_bucket={config.length_bucket}: SQuAD predicts per-token "
                                      "logits over whole windows, so its batches are not cut; set it to 0")
        self.config = config
        build = functools.partial(squad.build_features, tokenizer=tokenizer, family=family,
                                  max_seq_length=config.max_seq_length, doc_stride=config.doc_stride,
                                  max_query_length=config.max_query_length)
        questions, source = squad_split(config, "train")
        train_examples = first_n(squad.examples_of(questions, training=True, source=source), config.max_train_examples)
        features = build(train_examples)
        self.train_features = {k: features[k] for k in (*MODEL_INPUTS, "start_positions", "end_positions")}
        questions, source = squad_split(config, "validation")
        self.golds = squad_eval.gold_answers(questions)
        examples = squad.examples_of(questions, training=False, source=source)
        self.eval_sets = [EvalSet("predict", build(examples), examples, "predictions.json")]

    def model(self, model_config) -> nn.Module:
        return modeling.SpanExtractor(model_config)

    def finish(self, eval_set: EvalSet, outputs: dict[str, np.ndarray], workdir: storage.Path) -> dict[str, float]:
        """Decode the n-best spans into predictions.json and score it with the official rules."""
        cfg = self.config
        predictions = squad.decode_predictions(eval_set.reference, eval_set.features, outputs["start_logits"],
                                               outputs["end_logits"], cfg.n_best, cfg.max_answer_length,
                                               cfg.version_2, cfg.null_threshold)
        if jax.process_index() == 0:
            storage.atomic_write(workdir / eval_set.predictions_file, json.dumps(predictions, indent=1))
        return squad_eval.score(self.golds, predictions)


def squad_split(config, split: str) -> tuple[list, str]:
    """The questions of one SQuAD split (train | validation) and where they came from: config.train_file or
    config.predict_file when set, else config.data_dir."""
    key = {"train": "train_file", "validation": "predict_file"}[split]
    source, flag = (config[key], f"--config.{key}") if config[key] else (config.data_dir, "--config.data_dir")
    version = "v2.0" if config.version_2 else "v1.1"
    return squad.read_questions(source, split, version, config.tfds_data_dir or None, flag), source


def make_task(config, tokenizer, family: str):
    if tokenizer is None:
        raise FinetuneConfigError(f"config.init={config.init!r} has no tokenizer files; fine-tuning reads text, so "
                                  "put its tokenizer (tokenizer.json, vocab.txt, ...) next to the checkpoint")
    return (SquadTask if config.task == "squad" else GlueTask)(config, tokenizer, family)


def first_n(data, n: int):
    """The first n examples of a list or a glue.Split (n=0: all)."""
    if not n:
        return data
    if isinstance(data, glue.Split):
        return glue.Split(data.text_a[:n], data.text_b and data.text_b[:n],
                          None if data.labels is None else data.labels[:n])
    return data[:n]


# ------------------------------------------------------------------------------------------------------------------
# Data order, and batches split over hosts.
# ------------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def epoch_permutation(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def batch_rows(num_examples: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Example indices of global batch `step`."""
    positions = np.arange(step * batch_size, (step + 1) * batch_size)
    epochs, offsets = np.divmod(positions, num_examples)
    return np.array([epoch_permutation(num_examples, seed, int(e))[o] for e, o in zip(epochs, offsets)])


def host_rows(rows: np.ndarray) -> np.ndarray:
    """This process's contiguous share of a global batch's rows."""
    share = len(rows) // jax.process_count()
    return rows[jax.process_index() * share:(jax.process_index() + 1) * share]


def padded_length(attention_mask: np.ndarray, length_bucket: int) -> int:
    """Columns a batch needs: its longest row rounded up to a multiple of length_bucket (0: all columns).

    Padding is at the end of each row and masked, so cutting the all-padding columns changes no output while
    short-sentence tasks (SST-2, CoLA, STS-B) stop paying for max_seq_length; the multiple bounds recompilations.
    Computed from the global batch so that every host cuts the same columns.
    """
    width = attention_mask.shape[1]
    if not length_bucket:
        return width
    longest = int(attention_mask.sum(axis=1).max())
    return min(width, -(-longest // length_bucket) * length_bucket)


def take(features: dict[str, np.ndarray], rows: np.ndarray, length: int | None = None) -> dict[str, np.ndarray]:
    """Rows of every feature; per-token features ([N, max_seq_length]) cut to their first `length` columns."""
    return {k: v[rows, :length] if v.ndim == 2 else v[rows] for k, v in features.items()}


def global_rows_batch(features: dict[str, np.ndarray], rows: np.ndarray, length_bucket: int, batch_sharding):
    """The global batch of `rows` (indices into the whole set), as sharded arrays of this host's share."""
    length = padded_length(features["attention_mask"][rows], length_bucket)
    return train_lib.global_batch(take(features, host_rows(rows), length), batch_sharding)


def predict_all(predict_fn, params, features: dict[str, np.ndarray], batch_size: int, batch_sharding,
                length_bucket: int = 0):
    """Model outputs for every row, in order: the last batch is padded with copies of row 0, then cut."""
    n = len(features["input_ids"])
    inputs = {k: features[k] for k in MODEL_INPUTS}
    outputs = []
    for start in range(0, n, batch_size):
        rows = np.arange(start, start + batch_size)
        rows = np.where(rows < n, rows, 0)
        batch = global_rows_batch(inputs, rows, length_bucket, batch_sharding)
        outputs.append(jax.device_get(predict_fn(params, batch)))
    return {k: np.concatenate([o[k] for o in outputs])[:n] for k in outputs[0]}


# ------------------------------------------------------------------------------------------------------------------
# The fine-tuning run, top to bottom.
# ------------------------------------------------------------------------------------------------------------------


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """Fine-tune config.init on config.task, then predict and score every evaluation set; returns the scores."""
    from bert_jax.pretrained import load_pretrained  # Orbax and TF checkpoint readers load only when used

    if not config.init:
        raise FinetuneConfigError("config.init is empty; pass --config.init=PATH to a pretrained checkpoint (an HF "
                                  "directory, an original TF checkpoint or a bert_jax workdir)")

    # ---- Mesh, checkpoint to start from, and the task's data ----------------------------------------------------
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    for key in ("batch_size", "eval_batch_size"):
        if config[key] % shards:
            raise sharding.MeshError(f"config.{key}={config[key]} does not split over mesh data*fsdp = {shards}")
    pretrained = load_pretrained(config.init, head="backbone", mesh=mesh)  # placed as the state's backbone is
    config = with_model(config, pretrained.config)
    sharding.check_model_fits(config.model, mesh, config.max_seq_length, False, padded_vocab_size(config.model))
    task = make_task(config, pretrained.tokenizer, config.model.family)
    num_train = len(task.train_features["input_ids"])
    total_steps = math.ceil(num_train * config.num_epochs / config.batch_size)
    run_loop.announce("%s: %d training examples, %d steps of %d; evaluation sets %s", config.task, num_train,
                       total_steps, config.batch_size, [s.name for s in task.eval_sets])
    if total_steps < 1:
        raise FinetuneConfigError(f"config.num_epochs={config.num_epochs} over {num_train} examples gives no steps")
    opt = optimizer_config(config.optimizer, total_steps)
    optimizer_lib.validate(opt, total_steps, config.batch_size)
    run_loop.validate(config)
    workdir_lib.check(workdir, config)
    workdir = workdir_lib.create(workdir, config)

    # ---- Model, optimizer, state shardings; the pretrained backbone goes in, the head starts random --------------
    model = task.model(config.model)
    tx = optimizer_lib.make_optimizer(opt, total_steps)
    schedule = optimizer_lib.learning_rate_schedule(opt, total_steps)
    init_fn = functools.partial(train_lib.initial_state, model, tx)
    batch_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    manager = checkpoints.checkpoint_manager(workdir, config.keep_checkpoints)
    start_step, state, state_shardings = train_lib.resumed_or_fresh_state(manager, init_fn, mesh, config.seed)
    if not start_step:
        state["params"]["backbone"] = jax.device_put(pretrained.backbone_params(),
                                                     state_shardings["params"]["backbone"])

    # ---- Jitted steps ---------------------------------------------------------------------------------------------
    def loss_fn(params, batch, rng, deterministic=False):
        outputs = model.apply({"params": params}, **{k: batch[k] for k in MODEL_INPUTS},
                              deterministic=deterministic, rngs={"dropout": rng})
        return task.loss(outputs, batch)

    step_fn = jax.jit(sharding.laid_out(functools.partial(train_lib.train_step, loss_fn=loss_fn, tx=tx,
                                                          schedule=schedule, accum_steps=1), mesh),
                      in_shardings=(state_shardings, batch_sharding), out_shardings=(state_shardings, replicated),
                      donate_argnums=0)
    predict_fn = jax.jit(sharding.laid_out(lambda params, batch: {
        k: v for k, v in model.apply({"params": params}, **batch).items() if k in task.output_keys}, mesh),
                         in_shardings=(state_shardings["params"], batch_sharding), out_shardings=replicated)

    def evaluate(state) -> dict[str, float]:
        """Predict every evaluation set, write its prediction files and score it."""
        results = {}
        for eval_set in task.eval_sets:
            outputs = predict_all(predict_fn, state["params"], eval_set.features, config.eval_batch_size,
                                  batch_sharding, config.length_bucket)
            results.update({f"{eval_set.name}_{k}": v for k, v in task.finish(eval_set, outputs, workdir).items()})
        return results

    # ---- The run loop; after the last step every evaluation set is predicted and scored ----------------------------
    batches = (global_rows_batch(task.train_features, batch_rows(num_train, config.batch_size, config.seed, step),
                                 config.length_bucket, batch_sharding) for step in itertools.count(start_step))
    loop_schedule = run_loop.Schedule.of(config, total_steps)
    outcome = run_loop.run(state, start_step, batches, step_fn, loop_schedule, workdir, manager, evaluate)
    if outcome.stopped:
        return {}
    run_loop.announce("results: %s", json.dumps(outcome.evaluation))
    if jax.process_index() == 0:
        storage.atomic_write(workdir / workdir_lib.RESULTS_FILE, json.dumps(outcome.evaluation, indent=1))
    return outcome.evaluation


def with_model(config: ml_collections.ConfigDict, model: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of the config whose config.model is the pretrained checkpoint's architecture."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.model = ml_collections.ConfigDict(model.to_dict())
    config.lock()
    return config


def optimizer_config(opt: ml_collections.ConfigDict, total_steps: int) -> ml_collections.ConfigDict:
    """config.optimizer in the form bert_jax.optimizer takes: warmup as a step count, no accumulation."""
    values = {k: v for k, v in opt.to_dict().items() if k != "warmup_fraction"}
    warmup = int(opt.warmup_fraction * total_steps)
    return ml_collections.ConfigDict(dict(values, warmup_steps=min(warmup, total_steps - 1), grad_accum_steps=1))


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    cli.run(train_lib.command(train_and_evaluate))
