"""The one house of configuration: the defaults every config starts from (model, data, masking, trainer,
fine-tuning), their validation, and preset loading.

Every config is a locked `ml_collections.ConfigDict`: setting or reading an unknown key raises an error that names it.
A family's presets (sizes, objective, tokenizer, example and masking defaults) live in its `bert_jax/families` file;
the files in `configs/` are what `--config=` names and are built from the functions here.
"""
from __future__ import annotations

import importlib.util
import pathlib

import ml_collections

from bert_jax import families
from bert_jax.errors import UserError
from bert_jax.optimizer import DEFAULT_NO_WEIGHT_DECAY

ACTIVATIONS = ("gelu", "gelu_new", "relu", "silu", "tanh")
REMAT_POLICIES = ("none", "full", "dots", "dots_with_no_batch_dims")
DTYPES = ("float32", "bfloat16")
# "reference": Flax's attention, which materialises the probabilities; "xla", "cudnn": a fused
# jax.nn.dot_product_attention kernel (no attention dropout); "splash": flash attention for TPU in Pallas (bert_jax's
# kernel, which also drops the probabilities, or Pallas' block-sparse splash for ModernBERT); "auto": splash on TPU,
# cuDNN on GPU, XLA elsewhere (docs/training.md, "Attention kernels and dropout").
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash", "reference")
CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"
SAMPLE_CORPUS = "data/corpus/*.txt"
# docs/reliability.md says how these defaults were chosen (the first compile, the longest step, a loaded machine).
WATCHDOG_S = 900
PEER_TIMEOUT_S = 60


class ConfigError(UserError, ValueError):
    """A config value that cannot work; the message names the key."""


def model_config(family: str, **sizes) -> ml_collections.ConfigDict:
    """Architecture hyper-parameters, defaulting to BERT-Base; `sizes` overrides any of them."""
    model = ml_collections.ConfigDict(
        dict(
            family=family,
            vocab_size=30522,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            hidden_act="gelu",
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
            max_position_embeddings=512,
            type_vocab_size=2,
            layer_norm_eps=1e-12,
            initializer_range=0.02,
            # Width of the token embeddings; ALBERT and ELECTRA project E -> H when it differs from hidden_size.
            embedding_size=768,
            # ALBERT's cross-layer sharing: layers are split into this many groups that share one set of weights.
            num_hidden_groups=12,
            # RoBERTa numbers positions from pad_token_id + 1 and skips padding, as fairseq does.
            pad_token_id=0,
            pooler=True,
            # Dtype of the stored parameters: the master weights the optimizer updates (its moments follow them).
            param_dtype="float32",
            # Execution switches (none changes the parameters' values).
            dtype="float32",  # compute dtype of matmuls and activations; softmax, LayerNorm statistics, losses: float32
            remat_policy="none",
            scan_layers=False,
            # Which attention kernel runs (ATTENTION_IMPLS; transformer.attention_kernel has the rule). "auto": a
            # fused kernel, except in training with attention dropout, which only the "reference" path has.
            attention_impl="auto",
        )
    )
    # ELECTRA's generator: a narrower encoder of the same depth that shares the embeddings. None elsewhere.
    model.generator = ml_collections.ConfigDict(
        dict(hidden_size=0, num_attention_heads=0, intermediate_size=0, num_hidden_layers=0)
    )
    model.update(sizes)
    if sizes.get("embedding_size") is None:
        model.embedding_size = model.hidden_size
    if "num_hidden_groups" not in sizes:
        model.num_hidden_groups = model.num_hidden_layers
    return model


def validate_model_config(model: ml_collections.ConfigDict, needs_generator: bool = False) -> None:
    """Raise ConfigError naming the first inconsistent key; call before building a model.

    `needs_generator`: ELECTRA pretraining needs config.model.generator; a lone discriminator or generator does not.
    """

    def require(ok: bool, key: str, why: str) -> None:
        if not ok:
            value = model
            for part in key.split("."):
                value = value[part]
            raise ConfigError(f"config.model.{key}={value!r}: {why}")

    require(model.family in families.names(), "family", f"must be one of {families.names()}")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size", "embedding_size", "num_hidden_groups"):
        require(int(model[key]) > 0, key, "must be a positive integer")
    require(model.hidden_size % model.num_attention_heads == 0, "hidden_size",
            f"must be divisible by num_attention_heads={model.num_attention_heads}")
    require(model.num_hidden_layers % model.num_hidden_groups == 0, "num_hidden_groups",
            f"must divide num_hidden_layers={model.num_hidden_layers}")
    require(model.hidden_act in ACTIVATIONS, "hidden_act", f"must be one of {ACTIVATIONS}")
    require(model.dtype in DTYPES, "dtype", f"must be one of {DTYPES}")
    require(model.param_dtype in DTYPES, "param_dtype", f"must be one of {DTYPES}")
    require(model.remat_policy in REMAT_POLICIES, "remat_policy", f"must be one of {REMAT_POLICIES}")
    require(model.attention_impl in ATTENTION_IMPLS, "attention_impl", f"must be one of {ATTENTION_IMPLS}")
    require(0.0 <= model.hidden_dropout_prob < 1.0, "hidden_dropout_prob", "must be in [0, 1)")
    require(0.0 <= model.attention_probs_dropout_prob < 1.0, "attention_probs_dropout_prob", "must be in [0, 1)")
    require(not model.scan_layers or families.of(model).scans_layers, "scan_layers",
            f"{model.family}'s layers are not all alike, so they cannot be scanned; set it False")
    if families.of(model).position_offset:
        require(model.max_position_embeddings > model.pad_token_id + 1, "max_position_embeddings",
                "positions start at pad_token_id + 1 (fairseq's numbering); leave room for them")
    gen = model.generator
    if needs_generator or gen.hidden_size > 0:
        for key in ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers"):
            require(int(gen[key]) > 0, f"generator.{key}", "replaced-token detection needs a generator size")
        require(gen.hidden_size % gen.num_attention_heads == 0, "generator.hidden_size",
                f"must be divisible by generator.num_attention_heads={gen.num_attention_heads}")


def generator_config(model: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The model config of ELECTRA's generator: the discriminator's, with the generator's widths and depth."""
    gen = ml_collections.ConfigDict(model.to_dict())
    gen.update(model.generator.to_dict())
    gen.num_hidden_groups = gen.num_hidden_layers
    gen.pooler = False
    return gen


def load_preset(name: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """The config that `--config=configs/<name>.py:<arg>` gives: a family's preset of size `arg` (its default size
    when None) from the registry, or another file of the repository's configs/ folder (glue, squad, compare)."""
    if name in families.names():
        family = families.get(name)
        size = arg or family.default_size
        model = model_config(family.name, **select_size(family.sizes, size, family.name))
        return lock(pretraining_config(model, objective=family.objective, size=size))
    path = CONFIG_DIR / f"{name}.py"
    if not path.exists():
        raise ConfigError(f"no config file {path}; families are {families.names()}")
    spec = importlib.util.spec_from_file_location(f"bert_jax_configs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config() if arg is None else module.get_config(arg)


def select_size(sizes: dict, size: str, family: str) -> dict:
    """Look up a size preset, with an error that lists the valid ones."""
    if size not in sizes:
        raise ConfigError(f"unknown {family} size {size!r}; choose one of {tuple(sizes)}")
    return dict(sizes[size])


def pretraining_config(model: ml_collections.ConfigDict, objective: str, size: str) -> ml_collections.ConfigDict:
    """Everything one pretraining run reads, with the model's architecture under `config.model`.

    Sections other than `model` are filled in by the pipeline and trainer defaults; every key exists here so that a
    typo in `--config.key=value` is an error rather than a silently ignored setting.
    """
    validate_model_config(model, needs_generator=objective == "rtd")
    config = ml_collections.ConfigDict()
    config.model = model
    config.objective = objective
    config.seed = 0
    config.data = data_config(model.family, size)
    config.masking = masking_config(model.family)
    config.update(trainer_config(model.family, size))
    return config


def data_config(family: str, size: str) -> ml_collections.ConfigDict:
    """Where the text comes from and how examples are shaped. Tiny presets read the bundled sample corpus."""
    spec = families.get(family)
    tiny = size == "tiny"
    return ml_collections.ConfigDict(dict(
        tokenizer_kind=spec.tokenizer.kind,
        tokenizer_path=spec.tokenizer.tiny_path if tiny else spec.tokenizer.full_path,
        lowercase=True,  # wordpiece only; sentencepiece and bpe carry their normalization in the model files
        # Either a folder written by `prepare`, or text files tokenized when the pipeline starts, read as `prepare`
        # reads them (comma-separated globs; meant for small corpora such as the sample one: the tokens stay in
        # memory).
        prepared_dir="",
        input_files=SAMPLE_CORPUS if tiny else "",
        example_kind=spec.example_kind,
        seq_length=128,
        batch_size=32 if tiny else 256,  # global batch; each host yields batch_size // process_count
        short_seq_prob=0.1,  # pairs: chance of a shorter target length, as in BERT
        shuffle=True,  # a full permutation of the examples every epoch (stateless, no buffer)
        prefetch_batches=4,
    ))


def masking_config(family: str) -> ml_collections.ConfigDict:
    """MLM masking: which tokens are predicted, and what replaces them in the input (the family's overrides on
    BERT's recipe)."""
    masking = ml_collections.ConfigDict(dict(
        mode="dynamic",  # static: dupe_factor fixed mask copies (BERT); dynamic: new masks every epoch
        dupe_factor=10,  # static only: epoch e uses mask copy e mod dupe_factor
        rate=0.15,  # of the non-special tokens, rounded, at least 1
        # Rates by step, "STEP:RATE,STEP:RATE,..." from step 0 (mmBERT's annealing); "" keeps `rate` throughout.
        rate_schedule="",
        max_predictions_per_seq=20,
        whole_word=False,
        ngram_max=1,  # span lengths n <= ngram_max with p(n) proportional to 1/n
        mask_token_prob=0.8,
        random_token_prob=0.1,  # the rest keeps the original token
    ))
    masking.update(families.get(family).masking)
    return masking


def fault_settings() -> dict:
    """What ends or guards a run, the same for pretraining and fine-tuning (docs/reliability.md)."""
    return dict(
        # What an unhealthy step does (bert_jax.health): a NaN/Inf loss or gradient norm, or a spike above the mean
        # + spike_sigmas standard deviations of the last spike_window healthy steps (0: no spike test). stop: the run
        # stops and a relaunch resumes from the last checkpoint shown good; skip: non-finite updates are dropped,
        # up to max_consecutive_skips in a row.
        nan_policy="stop",
        max_consecutive_skips=10,
        spike_window=128,
        spike_sigmas=6.0,
        # A step (compiles, saves and evaluations aside) that runs longer than this ends every process (0: never).
        watchdog_s=WATCHDOG_S,
        # The other processes of a multi-process run end this long after one stops sending heartbeats.
        distributed=dict(peer_timeout_s=PEER_TIMEOUT_S),
    )


def trainer_config(family: str, size: str) -> ml_collections.ConfigDict:
    """Loop, mesh and optimizer defaults of `bert_jax.train`; tiny presets run a short demo on a CPU."""
    tiny = size == "tiny"
    spec = families.get(family)
    lamb = spec.optimizer == "lamb"
    config = ml_collections.ConfigDict(dict(
        # Continued pretraining: start the parameters from anything load_pretrained reads (HF folder, TF1
        # checkpoint, bert_jax workdir or export); the optimizer, step and data start afresh. Ignored (and said so)
        # once the workdir holds a checkpoint of its own.
        init_from="",
        # A new phase of a run: also carry over the optimizer state (moments) of the bert_jax workdir in init_from,
        # with the learning-rate schedule started afresh (False: the optimizer starts afresh).
        init_from_optimizer=False,
        init_exclude="",  # a regex over '/'-joined parameter paths: matching ones start random (e.g. "pooler|head")
        total_steps=200 if tiny else 1_000_000,
        log_every_steps=10 if tiny else 100,
        checkpoint_every_steps=100 if tiny else 10_000,
        # Also save when this many seconds passed since the last save (0: off): a preempted pod slice loses at most
        # this much work whatever the step time.
        checkpoint_every_secs=0 if tiny else 1800,
        keep_checkpoints=3,
        eval_every_steps=100 if tiny else 10_000,  # 0 turns evaluation off
        eval_steps=2 if tiny else 20,  # batches per evaluation, from the stream seeded with seed + 1
        # Mesh axis sizes; -1 takes the devices the other axes leave. sequence_parallel splits the residual stream
        # (LayerNorm, dropout, residual adds) over tensor along the sequence instead of repeating it on each device.
        mesh=dict(data=-1, fsdp=1, tensor=1, sequence_parallel=False),
        optimizer=dict(
            name=spec.optimizer,  # adamw | lamb | stable_adamw
            # LAMB moves each layer by about learning_rate of its norm per step, so it takes a larger rate.
            learning_rate=(3e-2 if lamb else 1e-3) if tiny else spec.learning_rates.get(size, 1.76e-3 if lamb
                                                                                        else 1e-4),
            warmup_steps=20 if tiny else 10_000,
            **schedule_defaults(),
            b1=0.9,
            b2=0.999,
            eps=1e-6,
            grad_clip_norm=1.0,  # 0 turns clipping off
            grad_accum_steps=1,  # micro-batches per update; data.batch_size is the size of the whole update
        ),
        # Batch-size warmup (off while start is 0): the global batch grows from `start` sequences to
        # data.batch_size over the first `tokens` tokens, in `stages` sizes (each compiles one step program).
        batch_warmup=dict(start=0, tokens=0, stages=4),
        rtd_weight=50.0,  # ELECTRA: loss = generator MLM + rtd_weight * discriminator loss
        **fault_settings(),
        peak_flops=0.0,  # per device, for MFU; 0 measures a matmul at start
        # Keep compiled XLA programs here across restarts and hosts ("" turns the persistent cache off).
        compilation_cache_dir="",
    ))
    config.optimizer.update(spec.optimizer_settings)
    return config


def schedule_defaults() -> dict:
    """The learning-rate schedule and weight-decay keys of config.optimizer (pretraining and fine-tuning); see
    bert_jax.optimizer for what each schedule and decay shape is."""
    return dict(
        schedule="warmup_decay",  # warmup_decay: warmup, then `decay` to 0 at the end | wsd: warmup-stable-decay
        decay="linear",  # linear | polynomial (with `power`) | cosine | 1-sqrt
        power=2.0,
        decay_fraction=0.1,  # wsd: the share of the steps the decay takes (0: the rate stays constant)
        decay_start_step=0,  # wsd: when > 0, the decay runs from this step to the end (decay from a checkpoint)
        weight_decay=0.01,
        no_weight_decay=DEFAULT_NO_WEIGHT_DECAY,  # regex over '/'-joined parameter paths: biases, LayerNorm scales
        # Decay weights by weight_decay x schedule / peak instead of weight_decay x learning rate (optimi's
        # decouple_lr, ModernBERT's setting).
        fully_decoupled_weight_decay=False,
    )


def finetune_config(task: str, max_seq_length: int, batch_size: int, learning_rate: float,
                    num_epochs: float) -> ml_collections.ConfigDict:
    """The settings every fine-tuning run shares; configs/glue.py and configs/squad.py add their task's own."""
    return ml_collections.ConfigDict(dict(
        task=task,
        objective=f"finetune_{task}",  # what the workdir's checkpoints hold (checked on resume)
        init="",  # any path bert_jax.load_pretrained accepts (HF dir, TF1 checkpoint, bert_jax workdir); required
        # Replaced by the init checkpoint's architecture at start; listed so config.json records it.
        model=model_config("bert"),
        max_seq_length=max_seq_length,
        # Cut each batch's trailing padding to a multiple of this many tokens (0: always max_seq_length).
        length_bucket=0,
        batch_size=batch_size,
        eval_batch_size=64,
        num_epochs=num_epochs,
        max_train_examples=0,  # 0: all; else the first N (quick runs)
        seed=0,
        log_every_steps=50,
        checkpoint_every_steps=1000,
        checkpoint_every_secs=600,  # also save when this many seconds passed since the last save (0: off)
        keep_checkpoints=1,
        mesh=dict(data=-1, fsdp=1, tensor=1),
        optimizer=dict(
            name="adamw",
            learning_rate=learning_rate,
            warmup_fraction=0.1,  # of the total steps, then linear decay to 0
            **dict(schedule_defaults(), power=1.0),
            b1=0.9,
            b2=0.999,
            eps=1e-6,
            grad_clip_norm=1.0,
        ),
        **fault_settings(),
    ))


def lock(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Lock a finished config so unknown keys raise."""
    config.lock()
    return config
