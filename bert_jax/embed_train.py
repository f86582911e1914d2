"""Contrastive fine-tuning: an encoder becomes a sentence embedding model, trained on (query, positive[, negative])
pairs with InfoNCE over the whole global batch (bert_jax.objectives.contrastive).

    python -m bert_jax.embed_train --config=configs/embed.py:base --workdir=DIR --config.init=PATH \
        --config.train_files=pairs.jsonl [--config.eval_beir_dir=DIR] [--config.eval_sts_file=dev.tsv]

Everything else is fine-tuning's: the run loop (progress, metrics.jsonl + TensorBoard, checkpoints on a schedule and
on SIGTERM), the data order (batch i is a pure function of (seed, i), so a stopped run resumes exactly) and the
mesh. The workdir's checkpoints hold the backbone alone under "params" (a learned temperature sits in the train
state) and tokenizer/ a copy of the tokenizer, so `load_pretrained(DIR)` gives the embedding model with the pooling
it was trained with, and `convert --format=sentence-transformers` exports it. After the last step the BEIR folder
and the STS-B file, when given, are scored; the scores go to metrics.jsonl and results.json.
"""
from __future__ import annotations

import functools
import itertools
import json
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags, logging
from flax import linen as nn

from bert_jax import checkpoints, cli, modeling, run_loop, sentence_embedding, sharding, storage
from bert_jax import finetune as finetune_lib
from bert_jax import optimizer as optimizer_lib
from bert_jax import train as train_lib  # also defines the --workdir, --config and distributed flags used here
from bert_jax import workdir as workdir_lib
from bert_jax.errors import UserError
from bert_jax.objectives import contrastive
from bert_jax.modeling.transformer import padded_vocab_size
from bert_jax.pretrained import Pretrained, copy_tokenizer, load_pretrained, max_tokens
from bert_jax.tasks import pairs as pairs_lib
from bert_jax.tasks.text import encode_texts

FIELDS = ("query", "positive", "negative")


class EmbedConfigError(UserError, ValueError):
    """An embedding-run setting that cannot work; the message names the key."""


def run_pooling(config: ml_collections.ConfigDict) -> sentence_embedding.Pooling:
    """The sentence-vector rule the run trains and its checkpoints carry (see sentence_embedding.pooling_of_run)."""
    return sentence_embedding.pooling_of_run(config.to_dict())


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise, naming the key, for settings that cannot work; before anything is read or written."""
    if not config.init:
        raise EmbedConfigError("config.init is empty; pass --config.init=PATH to a pretrained checkpoint (an HF "
                               "directory, a sentence-transformers folder, an original TF checkpoint or a workdir)")
    if not config.train_files:
        raise EmbedConfigError("config.train_files is empty; pass JSON lines or parquet files of query/positive pairs")
    if config.pooling not in sentence_embedding.POOLINGS:
        raise EmbedConfigError(f"config.pooling={config.pooling!r}: must be one of {sentence_embedding.POOLINGS}")
    if not config.temperature > 0:
        raise EmbedConfigError(f"config.temperature={config.temperature!r}: must be positive")
    run_loop.validate(config)


def encode_pairs(pairs: pairs_lib.Pairs, tokenizer, family: str, config) -> dict[str, np.ndarray]:
    """Token ids and masks per field ([N, max_query_length] for queries, [N, max_seq_length] for the others)."""
    features = {}
    for field in FIELDS:
        texts = getattr(pairs, field)
        if texts is None:
            continue
        length = config.max_query_length if field == "query" else config.max_seq_length
        encoded, truncated = encode_texts(tokenizer, family, texts, None, length)
        if truncated:
            logging.warning("%d of %d %s texts are longer than %d tokens and were truncated", truncated, len(texts),
                            field, length)
        features[f"{field}_input_ids"], features[f"{field}_attention_mask"] = (encoded["input_ids"],
                                                                               encoded["attention_mask"])
    return features


def fields_of(batch) -> list[str]:
    return [field for field in FIELDS if f"{field}_input_ids" in batch]


def global_pairs_batch(features: dict[str, np.ndarray], rows: np.ndarray, length_bucket: int, batch_sharding):
    """The global batch of `rows` as sharded arrays of this host's share, each field cut to its longest text."""
    local_rows = finetune_lib.host_rows(rows)
    local = {}
    for field in fields_of(features):
        length = finetune_lib.padded_length(features[f"{field}_attention_mask"][rows], length_bucket)
        for kind in ("input_ids", "attention_mask"):
            local[f"{field}_{kind}"] = features[f"{field}_{kind}"][local_rows, :length]
    return train_lib.global_batch(local, batch_sharding)


def sentence_vectors(encoder: nn.Module, params, input_ids, attention_mask, pooling, deterministic, rng):
    """[B, H] pooled vectors of one field's texts."""
    hidden = encoder.apply({"params": params}, input_ids, attention_mask, jnp.zeros_like(input_ids),
                           deterministic=deterministic, rngs={"dropout": rng})["last_hidden_state"]
    return sentence_embedding.pool(hidden, attention_mask, pooling)


def contrastive_loss_fn(encoder: nn.Module, config: ml_collections.ConfigDict):
    """(trainable, batch, rng, deterministic) -> (loss, metrics): each field encoded with its own dropout key."""
    pooling = run_pooling(config)

    def loss_fn(trainable, batch, rng, deterministic: bool = False):
        fields = fields_of(batch)
        vectors = {field: sentence_vectors(encoder, trainable["encoder"], batch[f"{field}_input_ids"],
                                           batch[f"{field}_attention_mask"], pooling, deterministic, key)
                   for field, key in zip(fields, jax.random.split(rng, len(fields)))}
        if "temperature" in trainable:
            scale = jnp.exp(trainable["temperature"]["scale"])
        else:
            scale = 1.0 / config.temperature
        return contrastive.info_nce(vectors["query"], vectors["positive"], vectors.get("negative"), scale=scale,
                                    symmetric=config.symmetric)

    return loss_fn


# A learned temperature is one log(1 / temperature) named "scale", which weight decay skips as it skips LayerNorm's
# scales. It lives beside the encoder's params in the state, so that a checkpoint's params item is the backbone.


def trainable(state: dict) -> dict:
    """What the optimizer updates: the encoder, and the temperature when it is learned."""
    return {"encoder": state["params"], **({"temperature": state["temperature"]} if "temperature" in state else {})}


def initial_state(encoder: nn.Module, tx, config: ml_collections.ConfigDict, rng) -> dict:
    """The whole state, the encoder's params still boxed with logical names (eval_shape it for shardings)."""
    params_rng, state_rng = jax.random.split(rng)
    state = {"params": encoder.init(params_rng, **modeling.dummy_inputs())["params"]}
    if config.learn_temperature:
        state["temperature"] = {"scale": jnp.log(1.0 / jnp.float32(config.temperature))}
    return {**state, "opt_state": tx.init(trainable(state)), "step": jnp.zeros((), jnp.int32),
            "rng": jax.random.key_data(state_rng)}


def contrastive_step(state: dict, batch: dict, *, loss_fn, tx, schedule):
    """bert_jax.train's step (NaN policy, clipping, schedule) over the trainable tree, laid back into the state."""
    inner = {k: v for k, v in state.items() if k != "temperature"}
    new, metrics = train_lib.train_step({**inner, "params": trainable(state)}, batch, loss_fn=loss_fn, tx=tx,
                                        schedule=schedule, accum_steps=1)
    updated = new.pop("params")
    return {**new, "params": updated["encoder"],
            **({"temperature": updated["temperature"]} if "temperature" in updated else {})}, metrics


# ------------------------------------------------------------------------------------------------------------------
# The run, top to bottom.
# ------------------------------------------------------------------------------------------------------------------


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """Train config.init contrastively on config.train_files, then score the evaluation sets; returns the scores."""
    validate(config)

    # ---- Mesh, checkpoint to start from, and the pairs ------------------------------------------------------------
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if config.batch_size % shards:
        raise sharding.MeshError(f"config.batch_size={config.batch_size} does not split over mesh data*fsdp = {shards}")
    pretrained = load_pretrained(config.init, head="backbone", mesh=mesh)
    config = finetune_lib.with_model(config, pretrained.config)
    for key in ("max_seq_length", "max_query_length"):
        if not 2 < config[key] <= max_tokens(config.model):
            raise EmbedConfigError(f"config.{key}={config[key]}: must be in [3, {max_tokens(config.model)}], the "
                                   "positions of the model")
    sharding.check_model_fits(config.model, mesh, config.max_seq_length, False, padded_vocab_size(config.model))
    if pretrained.tokenizer is None:
        raise EmbedConfigError(f"config.init={config.init!r} has no tokenizer files; put its tokenizer "
                               "(tokenizer.json, vocab.txt, ...) next to the checkpoint")
    pairs = pairs_lib.read_pairs(config.train_files)
    features = encode_pairs(pairs, pretrained.tokenizer, config.model.family, config)
    num_train = len(pairs.query)
    total_steps = math.ceil(num_train * config.num_epochs / config.batch_size)
    run_loop.announce("%d pairs%s, %d steps of %d (in-batch negatives over the global batch)", num_train,
                      " with hard negatives" if pairs.negative else "", total_steps, config.batch_size)
    if total_steps < 1:
        raise EmbedConfigError(f"config.num_epochs={config.num_epochs} over {num_train} pairs gives no steps")
    opt = finetune_lib.optimizer_config(config.optimizer, total_steps)
    optimizer_lib.validate(opt, total_steps, config.batch_size)
    workdir_lib.check(workdir, config)
    workdir = workdir_lib.create(workdir, config)
    if jax.process_index() == 0 and not (workdir / workdir_lib.TOKENIZER_DIR).exists():
        copy_tokenizer(pretrained.tokenizer, storage.make_dirs(workdir / workdir_lib.TOKENIZER_DIR), config.model)

    # ---- Encoder, optimizer, state shardings; the pretrained backbone goes in ---------------------------------------
    encoder = modeling.backbone(config.model)
    tx = optimizer_lib.make_optimizer(opt, total_steps)
    schedule = optimizer_lib.learning_rate_schedule(opt, total_steps)
    init_fn = functools.partial(initial_state, encoder, tx, config)
    batch_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    manager = checkpoints.checkpoint_manager(workdir, config.keep_checkpoints)
    start_step, state, state_shardings = train_lib.resumed_or_fresh_state(manager, init_fn, mesh, config.seed)
    if not start_step:
        state["params"] = jax.device_put(pretrained.params, state_shardings["params"])

    # ---- The jitted step, and the evaluation after the last one ------------------------------------------------------
    step_fn = jax.jit(sharding.laid_out(functools.partial(contrastive_step,
                                                          loss_fn=contrastive_loss_fn(encoder, config), tx=tx,
                                                          schedule=schedule), mesh),
                      in_shardings=(state_shardings, batch_sharding), out_shardings=(state_shardings, replicated),
                      donate_argnums=0)

    def evaluate(state) -> dict[str, float]:
        """Retrieval on the BEIR folder and STS-B Spearman, with the params as they are now."""
        from bert_jax.evaluation import retrieval, similarity

        model = Pretrained(config.model, "backbone", state["params"], pretrained.tokenizer, run_pooling(config))
        scores = {}
        if config.eval_beir_dir:
            scores.update(retrieval.evaluate(model, config.eval_beir_dir, batch_size=config.eval_batch_size))
        if config.eval_sts_file:
            sts = similarity.evaluate(model, config.eval_sts_file, config.pooling)
            scores.update(sts_spearman=sts["spearman"], sts_pearson=sts["pearson"])
        return scores

    # ---- The run loop ---------------------------------------------------------------------------------------------
    batches = (global_pairs_batch(features, finetune_lib.batch_rows(num_train, config.batch_size, config.seed, step),
                                  config.length_bucket, batch_sharding) for step in itertools.count(start_step))
    loop_schedule = run_loop.Schedule.of(config, total_steps)
    has_evaluation = bool(config.eval_beir_dir or config.eval_sts_file)
    outcome = run_loop.run(state, start_step, batches, step_fn, loop_schedule, workdir, manager,
                           evaluate if has_evaluation else None)
    if outcome.stopped:
        return {}
    if jax.process_index() == 0 and has_evaluation:
        run_loop.announce("results: %s", json.dumps(outcome.evaluation))
        storage.atomic_write(workdir / workdir_lib.RESULTS_FILE, json.dumps(outcome.evaluation, indent=1))
    return outcome.evaluation


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    cli.run(train_lib.command(train_and_evaluate))
