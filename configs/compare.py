"""Budgets of the equal-compute comparison of the five families (bert_jax/experiments/compare.py).

    python -m bert_jax.experiments.compare --budget=cpu-small --workdir=runs/compare          # ~2.5 h, 2-core CPU
    python -m bert_jax.experiments.compare --budget=gpu-small --workdir=runs/compare-gpu \\
        --corpus='CORPUS/*.txt' --glue=GLUE                                                    # one GPU
    python -m bert_jax.experiments.compare --budget=tpu-base --workdir=gs://BUCKET/compare --distributed \\
        --corpus='gs://BUCKET/corpus/*.txt' --glue=tfds:glue --tfds_data_dir=gs://BUCKET/tfds  # every host of a slice

--glue is tfds:glue by default (`tfds build glue/sst2 glue/mrpc glue/stsb glue/rte glue/cola` fetches it), or a
folder holding the hub's nyu-mll/glue or GLUE's TSV task folders; --corpus is the bundled books by default.
Every family gets `pretrain_flops` training FLOPs (bert_jax/flops.py: model FLOPs of a step times the steps), so
a family whose step costs more takes fewer steps. All five share the encoder shape in `model`; ALBERT and ELECTRA
factorize the embeddings to `embedding_size` and ALBERT shares one layer's weights across the depth; ELECTRA's
generator is `generator_fraction` of the discriminator's width (the paper's Table 7 finds 1/4 to 1/2 best);
ModernBERT's GeGLU feed-forward has three H x FFN matrices, so its steps cost more and it takes fewer.
Each family keeps its paper's objective, masking, example packing, tokenizer kind, optimizer and schedule (LAMB for
ALBERT; StableAdamW with a warmup-stable-decay schedule, 1-sqrt decay, 30% masking and packed sequences for
ModernBERT).

- test:      seconds-scale smoke run of every stage (the test suite runs it).
- cpu-small: H=128, 4 layers, seq 128; 2.5e13 FLOPs each (5 to 10 minutes of pretraining per family on a
             2-core CPU), fine-tuning on the first 2,000 training examples of each task, 2 seeds at the full budget
             and 1 at half of it. Measured with the four older families: 58 min of pretraining and 60 of
             fine-tuning on a 2-core EPYC while another job shared the cores; ModernBERT adds a fifth of each.
- gpu-small: ELECTRA-Small's shape and its 1.4e18 training FLOPs (ELECTRA Table 1, "ELECTRA-Small"), full GLUE
             training sets, 3 seeds. Estimated (not yet measured) at about an hour of pretraining per family on an
             H100-class GPU in bfloat16 at 40% MFU; wants a corpus of Wikipedia/BooksCorpus scale.
- tpu-base:  BERT-Base's shape and its 6.4e19 training FLOPs (ELECTRA Table 1, "BERT-Base"), full GLUE, 3 seeds.
"""
import ml_collections

from bert_jax import config_lib

TASKS = ("sst2", "mrpc", "stsb", "rte", "cola")


def _budget(*, model, seq_length, batch_size, pretrain_flops, learning_rates, finetune, glue_points, dtype="float32"):
    return dict(model=model, seq_length=seq_length, batch_size=batch_size, pretrain_flops=pretrain_flops,
                learning_rates=learning_rates, finetune=finetune, glue_points=glue_points, dtype=dtype)


def _model(hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, embedding_size,
           generator_fraction=0.25):
    return dict(hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                intermediate_size=intermediate_size, embedding_size=embedding_size,
                generator_fraction=generator_fraction)


def _finetune(tasks=TASKS, seeds=(0, 1), learning_rate=1e-4, batch_size=32, num_epochs=3.0, max_seq_length=128,
              max_train_examples=0):
    return dict(tasks=tasks, seeds=seeds, learning_rate=learning_rate, batch_size=batch_size, num_epochs=num_epochs,
                max_seq_length=max_seq_length, max_train_examples=max_train_examples)


# Pretraining learning rates: Adam for BERT, RoBERTa, ELECTRA; LAMB (per-layer trust ratio) for ALBERT; StableAdamW
# for ModernBERT (its update clipping bounds each tensor's step, so it takes Adam's rate).
SMALL_RATES = dict(bert=1e-3, roberta=1e-3, albert=2e-2, electra=1e-3, modernbert=1e-3)
BUDGETS = {
    # tests/test_compare.py's whole experiment: every stage and family at the least cost (one task, 16 examples, the
    # final checkpoint alone; tests/test_compare.py checks the grid of earlier points by itself).
    "test": _budget(model=_model(32, 2, 2, 64, 16, generator_fraction=0.5), seq_length=64, batch_size=8,
                    pretrain_flops=4e9, learning_rates=SMALL_RATES, glue_points=(1.0,),
                    finetune=_finetune(tasks=("rte",), seeds=(0,), learning_rate=1e-3, batch_size=8,
                                       num_epochs=1.0, max_seq_length=64, max_train_examples=16)),
    "cpu-small": _budget(model=_model(128, 4, 2, 512, 64), seq_length=128, batch_size=32, pretrain_flops=2.5e13,
                         learning_rates=SMALL_RATES, glue_points=(0.5, 1.0),
                         finetune=_finetune(learning_rate=3e-4, max_train_examples=2000)),
    # ELECTRA's small-model recipe (Table 6/7): lr 5e-4 pretraining, 3e-4 fine-tuning, batch 128, seq 128.
    "gpu-small": _budget(model=_model(256, 12, 4, 1024, 128), seq_length=128, batch_size=128, pretrain_flops=1.4e18,
                         learning_rates=dict(bert=5e-4, roberta=5e-4, albert=5e-3, electra=5e-4, modernbert=5e-4),
                         glue_points=(0.25, 0.5, 1.0), dtype="bfloat16",
                         finetune=_finetune(seeds=(0, 1, 2), learning_rate=3e-4)),
    "tpu-base": _budget(model=_model(768, 12, 12, 3072, 128, generator_fraction=1 / 3), seq_length=512,
                        batch_size=256, pretrain_flops=6.4e19,
                        learning_rates=dict(bert=1e-4, roberta=1e-4, albert=1.76e-3, electra=2e-4, modernbert=8e-4),
                        glue_points=(0.25, 0.5, 1.0), dtype="bfloat16",
                        finetune=_finetune(seeds=(0, 1, 2), learning_rate=1e-4)),
}


def get_config(budget="cpu-small"):
    if budget not in BUDGETS:
        raise config_lib.ConfigError(f"unknown budget {budget!r}; choose one of {tuple(BUDGETS)}")
    config = ml_collections.ConfigDict(dict(budget=budget, **BUDGETS[budget]))
    return config_lib.lock(config)
