"""The online pipeline: a host's documents -> examples per objective -> masks -> fixed-shape numpy batches.

Batch i is a pure function of (seed, i, process): it holds the examples at positions p_i .. p_i+b_i-1 of the host's
endless example stream (b_i = step i's batch size // process_count; p_i = i*b without a batch-size warmup, else the
sum of the b of the steps before, see bert_jax.batch_warmup). Position q belongs to epoch e = q // E (E = the host's
example count) and, when shuffling, names example `index_shuffle(q mod E)` under the epoch's seed. The mask copy is
e mod dupe_factor for static masking and e for dynamic masking, and the masking rate that of step i
(masking.rate_schedule). Resuming at step N therefore needs only N.
"""
from __future__ import annotations

import itertools
from typing import Iterator

import ml_collections
import numpy as np
import tensorflow as tf
from absl import logging

from bert_jax import batch_warmup, storage
from bert_jax.errors import UserError
from bert_jax.input_pipeline import config as config_lib
from bert_jax.input_pipeline import documents, examples, masking, tokenizers
from bert_jax.input_pipeline.randomness import Stream, hash_bits


class DataConfigError(UserError, ValueError):
    """A config.data / config.masking value the pipeline cannot use; the message names the key."""


def validate(config: ml_collections.ConfigDict, process_count: int) -> None:
    """Raise DataConfigError naming the first bad key."""
    data, mask = config.data, config.masking

    def require(ok, key, why):
        if not ok:
            section, name = key.split(".")
            raise DataConfigError(f"config.{key}={config[section][name]!r}: {why}")

    require(data.example_kind in config_lib.EXAMPLE_KINDS, "data.example_kind",
            f"must be one of {config_lib.EXAMPLE_KINDS}")
    require(data.tokenizer_kind in tokenizers.KINDS, "data.tokenizer_kind", f"must be one of {tokenizers.KINDS}")
    require(bool(data.tokenizer_path), "data.tokenizer_path", "set it to the tokenizer's vocab.txt, .model or folder")
    require(bool(data.prepared_dir) or bool(data.input_files), "data.prepared_dir",
            "set it (a folder written by `prepare`) or config.data.input_files (text files)")
    require(data.seq_length >= 8, "data.seq_length", "must be at least 8")
    require(data.batch_size > 0 and data.batch_size % process_count == 0, "data.batch_size",
            f"must be a positive multiple of the process count {process_count}")
    require(0.0 <= data.short_seq_prob <= 1.0, "data.short_seq_prob", "must be in [0, 1]")
    batch_warmup.validate(config, process_count)
    require(mask.mode in config_lib.MASKING_MODES, "masking.mode", f"must be one of {config_lib.MASKING_MODES}")
    require(mask.dupe_factor >= 1, "masking.dupe_factor", "must be >= 1")
    require(0.0 < mask.rate < 1.0, "masking.rate", "must be in (0, 1)")
    try:
        config_lib.masking_rates(mask)
    except ValueError as e:
        require(False, "masking.rate_schedule", f"{e}; write STEP:RATE,STEP:RATE,... from step 0, e.g. "
                "'0:0.3,1000:0.15,2000:0.05'")
    require(1 <= mask.max_predictions_per_seq <= data.seq_length, "masking.max_predictions_per_seq",
            f"must be in [1, seq_length={data.seq_length}]")
    require(mask.ngram_max >= 1, "masking.ngram_max", "must be >= 1")
    require(mask.mask_token_prob >= 0 and mask.random_token_prob >= 0
            and mask.mask_token_prob + mask.random_token_prob <= 1.0, "masking.random_token_prob",
            "mask_token_prob and random_token_prob must be >= 0 and sum to at most 1")


def host_files(files: list[storage.Path], process_index: int, process_count: int, key: str) -> list[storage.Path]:
    """This host's share of the files: every process_count-th one, starting at process_index."""
    mine = files[process_index::process_count]
    if not mine:
        raise DataConfigError(f"config.{key}: {len(files)} file(s) cannot feed {process_count} processes; "
                              "give more files (prepare: more inputs or a smaller --docs_per_shard)")
    return mine


def load_documents(data: ml_collections.ConfigDict, tokenizer, process_index: int, process_count: int,
                   counts) -> list[tuple[np.ndarray, np.ndarray]]:
    """This host's documents, from prepared shards or by tokenizing text files now the way `prepare` does (skips
    added to `counts`); both may be local or in a bucket. Fewer than two is a NoDocumentsError saying why."""
    if data.prepared_dir:
        directory = config_lib.resolve_path(data.prepared_dir)
        shards = sorted(directory.glob("*.tfrecord"))
        if not shards:
            raise DataConfigError(f"config.data.prepared_dir={data.prepared_dir!r}: no *.tfrecord shards in "
                                  f"{directory}")
        mine = host_files(shards, process_index, process_count, "data.prepared_dir")
        docs = list(documents.read_shards(mine))
        counts["documents"] = len(docs)
        key, sources = "config.data.prepared_dir", f"{documents.plural(len(mine), 'shard')} in {directory}"
    else:
        files = host_files(documents.expand_patterns(data.input_files, "config.data.input_files"),
                           process_index, process_count, "data.input_files")
        docs = list(documents.tokenize_files(files, tokenizer, counts))
        key, sources = "config.data.input_files", documents.plural(len(files), "file")
    documents.check_enough_documents(counts, 2, sources, key)
    return docs


class PretrainingPipeline:
    """A host's examples with their masking; `dataset(first_position)` streams batches from any position."""

    def __init__(self, config: ml_collections.ConfigDict, process_index: int = 0, process_count: int = 1):
        validate(config, process_count)
        data = config.data
        self.config, self.process_index, self.process_count = config, process_index, process_count
        self.local_batch_size = data.batch_size // process_count
        self.tokenizer = tokenizers.load_tokenizer(data.tokenizer_kind, config_lib.resolve_path(data.tokenizer_path),
                                                   data.lowercase)
        counts = documents.new_counts()
        corpus, counts["long_sentences_split"] = examples.build_corpus(
            load_documents(data, self.tokenizer, process_index, process_count, counts), self.tokenizer.special.sep,
            max_sentence_length=examples.content_length(data.example_kind, data.seq_length))
        skipped = {k: counts[k] for k in (*documents.SKIP_COUNTS, "long_sentences_split") if counts[k]}
        logging.info("process %d reads %d documents; skipped or split: %s", process_index,
                     len(corpus.document_num_sentences), skipped or "none")
        self.examples = examples.ExampleBuilder(corpus, data.example_kind, data.seq_length, self.tokenizer.special,
                                                data.short_seq_prob)
        self.num_examples = self.examples.num_examples
        self.masker = masking.Masker(config.masking, self.tokenizer.special, self.tokenizer.vocab_size,
                                     self.tokenizer.word_start_table())
        self.rate_steps, self.rates = config_lib.masking_rates(config.masking)

    def copy_of_epoch(self, epochs):
        """Which mask/pair copy an epoch uses: e mod dupe_factor (static) or e itself (dynamic)."""
        m = self.config.masking
        return epochs % m.dupe_factor if m.mode == "static" else epochs

    def build(self, example_ids, epochs, step=0) -> dict[str, tf.Tensor]:
        """The masked batch of these examples in these epochs (int32 [B] each) at this step (the masking rate's
        clock); a pure function of its inputs."""
        example_ids, copies = tf.cast(example_ids, tf.int32), tf.cast(self.copy_of_epoch(epochs), tf.int32)
        keys = (self.config.seed, self.process_index, example_ids, copies)
        return self.masker(self.examples(*keys), keys, self.masking_rate_at(step))

    def masking_rate_at(self, step):
        """masking.rate, or the rate_schedule's rate of this step (a scalar tensor)."""
        if len(self.rates) == 1:
            return self.rates[0]
        index = tf.searchsorted(tf.constant(self.rate_steps, tf.int64), tf.reshape(tf.cast(step, tf.int64), [1]),
                                side="right")[0] - 1
        return tf.gather(tf.constant(self.rates, tf.float32), index)

    def example_ids_at(self, positions):
        """(example ids, epochs) at stream positions: a fresh permutation of the examples every epoch."""
        positions = tf.cast(positions, tf.int64)
        epochs, index = positions // self.num_examples, positions % self.num_examples
        if not self.config.data.shuffle:
            return index, epochs
        run_seed = tf.cast(hash_bits(self.config.seed, Stream.EPOCH_ORDER, self.process_index), tf.int64)
        seeds = tf.stack([tf.broadcast_to(run_seed, tf.shape(epochs)), epochs, tf.zeros_like(epochs)], axis=1)
        # The raw op takes one [3] seed per index (one permutation per epoch); the public wrapper mis-pads a batch.
        return tf.raw_ops.RandomIndexShuffle(index=index, seed=seeds,
                                             max_index=tf.constant(self.num_examples - 1, tf.int64)), epochs

    def batch_at(self, first_position, batch_size: int | None = None, step=0) -> dict[str, tf.Tensor]:
        """The local batch of `batch_size` examples (default local_batch_size) whose first one sits at this stream
        position, masked as at `step`."""
        size = batch_size or self.local_batch_size
        positions = tf.cast(first_position, tf.int64) + tf.range(size, dtype=tf.int64)
        return self.build(*self.example_ids_at(positions), step)

    def dataset(self, first_position: int = 0, batch_size: int | None = None, first_step: int = 0) -> tf.data.Dataset:
        """Endless batches of `batch_size` (default local_batch_size) examples starting at a stream position (step *
        local batch size, or epoch * num_examples); the first is the batch of step `first_step`.

        The batch function is traced as written, without autograph: it branches on Python values only, and
        autograph's conversion took 2 s of every run's start and wrote generated files into /tmp, which a killed run
        left behind."""
        size = batch_size or self.local_batch_size
        steps = tf.data.Dataset.range(first_step, np.iinfo(np.int64).max)
        at = tf.autograph.experimental.do_not_convert(
            lambda step: self.batch_at(first_position + (step - first_step) * size, size, step))
        return (steps.map(at, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
                .prefetch(self.config.data.prefetch_batches))

    def batches_from(self, start_step: int) -> Iterator[dict[str, np.ndarray]]:
        """This host's numpy batches from step `start_step` on, each the size batch_warmup gives its step."""
        plan = batch_warmup.stages(self.config)
        for stage, following in zip(plan, [*plan[1:], None]):
            first = max(start_step, stage.first_step)
            if following is not None and first >= following.first_step:
                continue
            position = batch_warmup.sequences_before(plan, first) // self.process_count
            batches = self.dataset(position, stage.batch_size // self.process_count, first).as_numpy_iterator()
            yield from batches if following is None else itertools.islice(batches, following.first_step - first)


def make_pretraining_dataset(config: ml_collections.ConfigDict, start_step: int = 0, process_index: int = 0,
                             process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """Endless numpy batches for pretraining, starting at batch `start_step` (resume = pass the step).

    Each process gets batch_size // process_count examples per batch from its own share of the data
    (shard k goes to process k mod process_count). Keys, all int32 (B = local batch, S = config.data.seq_length,
    P = config.masking.max_predictions_per_seq):
      input_ids [B, S]            token ids after masking
      input_mask [B, S]           1 on real tokens, 0 on padding
      segment_ids [B, S]          0 for [CLS] A [SEP], 1 for B [SEP] (pairs); all 0 otherwise
      masked_lm_positions [B, P]  positions to predict, padded with 0
      masked_lm_ids [B, P]        the original token ids there, padded with 0
      masked_lm_weights [B, P]    1 for a real prediction, 0 for padding
      next_sentence_labels [B]    nsp_pairs only: 1 when B is random text from another document
      sentence_order_labels [B]   sop_pairs only: 1 when A and B are swapped
      packing_segment_ids [B, S]  full_sentences / doc_sentences / packed_documents only: 1 + index of the
                                  document inside the sequence (0 on padding), for attention within a document
    """
    return PretrainingPipeline(config, process_index, process_count).batches_from(start_step)
