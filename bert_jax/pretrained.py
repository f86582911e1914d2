"""`load_pretrained` and `save_pretrained`: one object for notebooks over HF, original TF1 and bert_jax checkpoints.

Every source becomes (model config, head, params): HF and TF1 files through the tables in `state_dict` and
`tf_checkpoint`, bert_jax workdirs through Orbax. A head names which model the params fill:
  backbone       EncoderModel                       (any checkpoint's encoder)
  pretraining    PreTrainingModel, MLM + NSP/SOP    (BERT, ALBERT)
  masked_lm      PreTrainingModel, MLM only         (BERT, RoBERTa, ALBERT)
  discriminator  ElectraDiscriminator
  generator      ELECTRA's generator, a PreTrainingModel with the generator's config
  both           Electra: generator and discriminator sharing their embeddings
A checkpoint holds one head and can be loaded as any head inside it (e.g. a BertForPreTraining file as backbone).

The bert_jax format is the trainer's workdir: config.json (model architecture under "model", objective under
"objective") and an Orbax CheckpointManager directory checkpoints/<step>/ whose item "params" is the params pytree.
A sentence-transformers folder is an HF directory plus the files that say how its sentence vectors are made (see
`sentence_embedding`); it loads as the backbone with that `pooling`, and `format="sentence-transformers"` writes one.
Every path may be local or a bucket URL (gs://...): files are read and written through `storage`.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import io
import itertools
import json
import pickle
import re
import uuid
import warnings

import jax
import ml_collections
import numpy as np
import safetensors
import safetensors.numpy
from flax import linen as nn

from bert_jax import (checkpoints, config_lib, families, modeling, sentence_embedding, sharding, state_dict, storage,
                      tf_checkpoint)
from bert_jax.errors import UserError
from bert_jax.input_pipeline import config as input_config
from bert_jax.input_pipeline import tokenizers as tokenizer_lib
from bert_jax.modeling.transformer import pad_vocab, to_unscanned_layout
from bert_jax.state_dict import LoadError
from bert_jax.workdir import CHECKPOINT_DIR, CONFIG_FILE, TOKENIZER_DIR

# The heads a checkpoint with each head also holds.
CONTAINED_HEADS = {"both": ("discriminator", "generator", "backbone"), "pretraining": ("masked_lm", "backbone"),
                   "masked_lm": ("backbone",), "discriminator": ("backbone",), "generator": ("backbone",),
                   "backbone": ()}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt")
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
FORMATS = ("hf", "bert_jax", "sentence-transformers")
CPU_CALL_BYTES = 12 << 20  # an encoder call's activations on the CPU (cpu_rows_per_call): 1024 of MiniLM's tokens
PACKED_ROW_TOKENS = 128  # the rows `embed` packs texts into (pack_rows); a longer text opens a power-of-two row


class OutputExistsError(UserError, FileExistsError):
    """save_pretrained's output folder already holds files; nothing was written."""


@dataclasses.dataclass
class Pretrained:
    """A loaded checkpoint: `params` fill `model` (built from `config` for `head`); `tokenizer` may be None.

    `params` and `model` have the padded vocabulary (see modeling.transformer.padded_vocab_size); what this hands
    to users (fill_mask's predictions, HF exports) has config.vocab_size entries. `pooling` is how `embed` makes
    sentence vectors when the checkpoint says (a sentence-transformers folder, an embedding run); None: [CLS]."""

    config: ml_collections.ConfigDict
    head: str
    params: dict
    tokenizer: tokenizer_lib.Tokenizer | None = None
    pooling: sentence_embedding.Pooling | None = None

    @functools.cached_property
    def model(self) -> nn.Module:
        return modeling.model_for_head(self.config, self.head)

    def backbone_params(self) -> dict:
        return narrow(self.params, self.config, self.head, "backbone")[0]

    @functools.cached_property
    def _encode_fn(self):
        encoder = modeling.backbone(self.config)
        return jax.jit(lambda params, **inputs: encoder.apply({"params": params}, **inputs))

    @functools.cached_property
    def _mlm_logits_fn(self):
        """[B, S, vocab_size] MLM logits: the model's padded vocabulary columns cut off, as users see them."""
        vocab = self.config.vocab_size
        if self.head == "both":
            return jax.jit(lambda p, *inputs: self.model.apply({"params": p}, *inputs,
                                                               method="generator_logits")[..., :vocab])
        return jax.jit(lambda p, *inputs: self.model.apply({"params": p}, *inputs)["mlm_logits"][..., :vocab])

    def encode(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
               packing_segment_ids=None) -> dict[str, np.ndarray]:
        """The encoder's outputs as numpy: last_hidden_state [B, S, H], and pooler_output [B, H] when the model
        has a pooler (ELECTRA has none). position_ids and packing_segment_ids, as the model takes them, let a row
        hold several texts (packed_inputs)."""
        ids = np.asarray(input_ids, np.int32)
        inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids) if attention_mask is None else attention_mask,
                  "token_type_ids": np.zeros_like(ids) if token_type_ids is None else token_type_ids,
                  "position_ids": position_ids, "packing_segment_ids": packing_segment_ids}
        inputs = {name: np.asarray(array, np.int32) for name, array in inputs.items() if array is not None}
        count = len(ids)
        rows = cpu_rows_per_call(self.config, ids.shape[1]) if self._on_one_cpu else count
        if count <= rows:
            return {name: np.asarray(value)
                    for name, value in self._encode_fn(self.backbone_params(), **inputs).items()}
        padded = -(-count // rows) * rows  # the last call padded to `rows`: one compiled shape a length
        inputs = {name: np.pad(array, ((0, padded - count), (0, 0))) for name, array in inputs.items()}
        calls = [self._encode_fn(self.backbone_params(), **{name: array[start:start + rows]
                                                             for name, array in inputs.items()})
                 for start in range(0, padded, rows)]
        return {name: np.concatenate([np.asarray(call[name]) for call in calls])[:count] for name in calls[0]}

    @functools.cached_property
    def _on_one_cpu(self) -> bool:
        """The params sit on one CPU device (load_pretrained without a mesh)."""
        devices = {device for leaf in jax.tree.leaves(self.params) for device in leaf.sharding.device_set}
        return len(devices) == 1 and devices.pop().platform == "cpu"

    def tokenize(self, texts: list[str]) -> dict[str, np.ndarray]:
        """[CLS] text [SEP] per text, truncated to the model's length (or the pooling's max_seq_length) and padded
        to the longest."""
        return self._batch(self._text_tokens(texts))

    def _text_tokens(self, texts: list[str]) -> list[list[int]]:
        """Each text's tokens, cut so that [CLS] text [SEP] fits the model (or the pooling's max_seq_length)."""
        length = max_tokens(self.config)
        if self.pooling is not None and self.pooling.max_seq_length:
            length = min(length, self.pooling.max_seq_length)
        return [tokens[:length - 2] for tokens in self._require_tokenizer().encode_batch(list(texts))]

    def _require_tokenizer(self) -> tokenizer_lib.Tokenizer:
        if self.tokenizer is None:
            raise LoadError("this checkpoint was loaded without tokenizer files; pass token ids to .encode, or put a "
                            "tokenizer.json / vocab.txt / vocab.json+merges.txt / *.model next to the checkpoint")
        return self.tokenizer

    def _framed(self, token_lists: list[list[int]]) -> list[list[int]]:
        special = self._require_tokenizer().special
        return [[special.cls, *tokens, special.sep] for tokens in token_lists]

    def _batch(self, token_lists: list[list[int]]) -> dict[str, np.ndarray]:
        special = self._require_tokenizer().special
        rows = self._framed(token_lists)
        length = min(bucketed_length(max(len(row) for row in rows)), max_tokens(self.config))
        input_ids = np.full((len(rows), length), special.pad, np.int32)
        attention_mask = np.zeros((len(rows), length), np.int32)
        for i, row in enumerate(rows):
            input_ids[i, :len(row)], attention_mask[i, :len(row)] = row, 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": np.zeros_like(input_ids)}

    def embed(self, texts: list[str], pooling: str | None = None, normalize: bool | None = None,
              batch_size: int = 32) -> np.ndarray:
        """[n, hidden] sentence vectors: the [CLS] hidden state, or the mean over real tokens
        (sentence-transformers' pooling); `normalize` scales each to unit length for cosine similarity. Unset, both
        follow the checkpoint's `pooling` ([CLS], not normalized, when it has none).

        Short texts share rows (pack_rows), each seeing only itself, so that calls hold real tokens rather than
        padding; a call takes batch_size rows."""
        rule = sentence_embedding.overridden(self.pooling, pooling, normalize)
        texts = list(texts)
        vectors = np.zeros((len(texts), self.config.hidden_size), np.float32)
        if not texts:
            return vectors
        framed = self._framed(self._text_tokens(texts))
        pad, first = self._require_tokenizer().special.pad, first_position(self.config)
        rows = pack_rows([len(tokens) for tokens in framed], PACKED_ROW_TOKENS)
        for inputs, token_slots, call_texts in packed_calls(framed, rows, batch_size, pad, first):
            hidden = self.encode(**inputs)["last_hidden_state"]
            vectors[call_texts] = sentence_embedding.pool(
                hidden.reshape(-1, hidden.shape[-1])[token_slots], token_slots >= 0, rule)
        return vectors

    def fill_mask(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
        """For each mask token in `text` (e.g. "[MASK]", "<mask>"), the top_k (token, probability) predictions."""
        if self.head not in ("pretraining", "masked_lm", "generator", "both"):
            raise LoadError(f"fill_mask needs a masked-LM head; this is a {self.head!r} model (load a pretraining, "
                            "masked_lm or ELECTRA generator checkpoint)")
        tokenizer = self._require_tokenizer()
        mask_token = tokenizer.id_to_token(tokenizer.special.mask)
        pieces = [tokenizer.encode(piece.strip()) if piece.strip() else [] for piece in text.split(mask_token)]
        if len(pieces) < 2:
            raise ValueError(f"no {mask_token} in {text!r}")
        tokens = functools.reduce(lambda left, right: left + [tokenizer.special.mask] + right, pieces)
        inputs = self._batch([tokens])
        logits = np.asarray(self._mlm_logits_fn(self.params, inputs["input_ids"], inputs["attention_mask"],
                                                inputs["token_type_ids"]))[0]
        probabilities = np.asarray(jax.nn.softmax(logits[inputs["input_ids"][0] == tokenizer.special.mask], -1))
        return [[(tokenizer.id_to_token(int(i)), float(p[i])) for i in np.argsort(-p)[:top_k]] for p in probabilities]


def bucketed_length(longest: int) -> int:
    """The length `tokenize` pads a batch to, so that batches of like length reuse one compiled encoder: a multiple
    of 16 up to 128 tokens, then of an eighth of the next power of two (160, 192, 224, 256, 320, ...), so above 128
    tokens padding adds under a quarter to a batch's work and each doubling compiles 4 more shapes. (`embed` packs
    its texts instead: pack_rows.)"""
    step = max(16, (1 << (longest - 1).bit_length()) // 8)
    return -(-longest // step) * step


def pack_rows(lengths: list[int], row_tokens: int) -> list[tuple[int, list[int]]]:
    """(length, texts) of the rows `embed` encodes: the texts (indices into `lengths`) side by side in each, longest
    first into the row whose free space fits them most tightly (best fit decreasing). A row holds row_tokens, or the
    power of two that holds a longer text opening it, whose slack shorter texts then fill; rows come longest first,
    each length a compiled shape. benchmarks/embed.py's 512 sentences (21,036 tokens) fill 21,120 slots in rows of
    two lengths, where batches of 32 padded to their bucketed_length held 29,696 (benchmarks/RESULTS.md)."""
    rows, free, most_free = [], [], 0
    rows_with_free = collections.defaultdict(list)  # free slots -> rows with exactly that many
    for text in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        need = lengths[text]
        row = next((rows_with_free[space].pop() for space in range(need, most_free + 1) if rows_with_free.get(space)),
                   None)
        if row is None:
            row = len(rows)
            rows.append((max(row_tokens, 1 << (need - 1).bit_length()), []))
            free.append(rows[row][0])
        rows[row][1].append(text)
        free[row] -= need
        rows_with_free[free[row]].append(row)
        most_free = max(most_free, free[row])
    return rows


def packed_calls(framed: list[list[int]], rows: list[tuple[int, list[int]]], rows_per_call: int, pad_id: int,
                 first: int):
    """The encoder calls of pack_rows' `rows` (longest first): up to rows_per_call rows of one length each, as
    (packed_inputs' inputs and token slots, the texts in the order of the slots)."""
    for length, same_length in itertools.groupby(rows, key=lambda row: row[0]):
        texts_by_row = [texts for _, texts in same_length]
        for start in range(0, len(texts_by_row), rows_per_call):
            call = texts_by_row[start:start + rows_per_call]
            yield *packed_inputs(framed, call, length, pad_id, first), [text for row in call for text in row]


def packed_inputs(framed: list[list[int]], rows: list[list[int]], length: int, pad_id: int,
                  first: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Encoder inputs [len(rows), length] for `rows` of texts (indices into `framed`, [CLS] text [SEP] each) side by
    side: each text's positions count from `first` as if it were alone, and its packing segment id keeps its
    attention to itself. Also each text's token slots in the flattened rows, [texts, longest], -1 past its end."""
    input_ids = np.full((len(rows), length), pad_id, np.int32)
    attention_mask, position_ids, segment_ids = (np.zeros_like(input_ids) for _ in range(3))
    texts = [text for row in rows for text in row]
    token_slots = np.full((len(texts), max(len(framed[text]) for text in texts)), -1, np.int64)
    text_index = 0
    for r, row in enumerate(rows):
        start = 0
        for segment, text in enumerate(row, 1):
            tokens = framed[text]
            span = slice(start, start + len(tokens))
            input_ids[r, span], attention_mask[r, span], segment_ids[r, span] = tokens, 1, segment
            position_ids[r, span] = first + np.arange(len(tokens))
            token_slots[text_index, :len(tokens)] = r * length + np.arange(start, start + len(tokens))
            start += len(tokens)
            text_index += 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
            "packing_segment_ids": segment_ids}, token_slots


def cpu_rows_per_call(config: ml_collections.ConfigDict, length: int) -> int:
    """How many rows of `length` tokens an encoder call on the CPU takes at once: a power of two whose float32
    activations (the FFN's width and four hidden-wide tensors a token) stay within CPU_CALL_BYTES. XLA:CPU allocates
    a call's temporaries afresh, and glibc maps those above its 32 MB mmap ceiling as new pages, faulted in on every
    call: MiniLM at 32 x 256 in one call faulted 303k pages and took 995 ms (1.80 s of CPU time), in calls of 4 rows
    none and 613 ms (1.12 s) (benchmarks/RESULTS.md, "Train step and embeddings on CPU")."""
    per_row = length * 4 * (config.intermediate_size + 4 * config.hidden_size)
    return 1 << max(0, (CPU_CALL_BYTES // per_row).bit_length() - 1)


def first_position(config: ml_collections.ConfigDict) -> int:
    """A text's first position id: 0, or pad_token_id + 1 in fairseq's numbering (RoBERTa)."""
    return config.pad_token_id + 1 if families.of(config).position_offset else 0


def max_tokens(config: ml_collections.ConfigDict) -> int:
    """The longest input a model's position table takes: RoBERTa's positions start after pad_token_id."""
    return config.max_position_embeddings - first_position(config)


def narrow(params, config, have: str, want: str):
    """(params, config) of head `want` inside a checkpoint of head `have`."""
    if want == have:
        return params, config
    if want not in CONTAINED_HEADS[have]:
        raise LoadError(f"this checkpoint holds a {have!r} model, which does not contain head={want!r}; "
                        f"it loads as {(have,) + CONTAINED_HEADS[have]}")
    if have == "both":
        part = "generator" if want == "generator" else "discriminator"
        part_config = config_lib.generator_config(config) if part == "generator" else config
        return narrow(state_dict.electra_parts(params)[part], part_config, part, want)
    if want == "backbone":
        return params["backbone"], config
    return {k: v for k, v in params.items() if k != "sentence_pair_head"}, config  # pretraining -> masked_lm


def abstract_target(model: nn.Module, mesh=None):
    """The params as ShapeDtypeStructs carrying their wanted shardings (what Orbax restores onto): the first CPU
    device by default, else the mesh through the logical-axis rules."""
    boxed = modeling.abstract_params(model)
    if mesh is None:
        cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
        shardings = jax.tree.map(lambda _: cpu, nn.unbox(boxed))
    else:
        shardings = sharding.mesh_shardings(boxed, mesh)
    return jax.tree.map(lambda leaf, where: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=where),
                        nn.unbox(boxed), shardings)


# ----------------------------------------------------------------------------------------------------------- load


def load_pretrained(path, head: str | None = None, mesh=None) -> Pretrained:
    """Load an HF model directory, an original TF1 checkpoint directory, or a bert_jax workdir (or one of its
    checkpoints/<step>). `head` picks a model inside the checkpoint (default: everything it holds); with `mesh`
    the params are sharded over it by the logical-axis rules, else they sit on the CPU."""
    path = storage.orbax_path(path)
    storage.check_bucket(path)
    if not path.exists() and not tf_checkpoint.index_file(path).exists():
        raise LoadError(f"{path} does not exist")
    if head is not None and head not in modeling.HEADS:
        raise LoadError(f"head={head!r}; choose one of {modeling.HEADS}")
    config, have, params, tokenizer = read_checkpoint(path, mesh)
    params, config = narrow(params, config, have, head or have)
    model = modeling.model_for_head(config, head or have)
    params = jax.device_put(params, jax.tree.map(lambda leaf: leaf.sharding, abstract_target(model, mesh)))
    return Pretrained(config=config, head=head or have, params=params, tokenizer=tokenizer,
                      pooling=read_pooling(path))


def read_pooling(path: storage.Path) -> sentence_embedding.Pooling | None:
    """How the checkpoint makes sentence vectors: a sentence-transformers folder's modules, or the config of an
    embedding run (bert_jax.embed_train); None for other checkpoints."""
    workdir, _ = workdir_and_step(path)
    if workdir is not None:
        return sentence_embedding.pooling_of_run(_read_json(workdir / CONFIG_FILE))
    return sentence_embedding.read_folder_pooling(path) if path.is_dir() else None


def read_checkpoint(path: storage.Path, mesh=None):
    """(model config, head, params, tokenizer) of whatever checkpoint `path` is."""
    workdir, step = workdir_and_step(path)
    if workdir is not None:
        return (*read_workdir(workdir, step, mesh), find_tokenizer(workdir, _workdir_tokenizer(workdir)))
    directories = _hf_directories(path)
    if directories:
        configs = {name: _read_json(d / "config.json") for name, d in directories.items()}
        states = {name: read_hf_weights(d) for name, d in directories.items()}
        config, head, params = from_hf(configs, states)
        first = next(iter(directories.values()))
        check_position_numbering(config, head, params, first / "config.json")
        return config, head, params, find_tokenizer(first)
    if tf_checkpoint.index_file(path).exists() or list(path.glob("*.index")) or (path / "checkpoint").exists():
        return (*from_hf(*tf_checkpoint.read(path)), find_tokenizer(path if path.is_dir() else path.parent))
    raise LoadError(f"{path}: not a checkpoint. Expected an HF directory (config.json + {' or '.join(HF_WEIGHTS)}), "
                    "an original TF checkpoint directory (model.ckpt-*.index + bert_config.json or "
                    "albert_config.json) or a bert_jax workdir (config.json + checkpoints/)")


def _hf_directories(path: storage.Path) -> dict[str, storage.Path]:
    """{"model": path} for an HF directory; discriminator/ and generator/ for a joint ELECTRA export; else {}."""
    if (path / "config.json").exists():
        return {"model": path}
    parts = {part: path / part for part in ("discriminator", "generator")}
    return parts if all((d / "config.json").exists() for d in parts.values()) else {}


def from_hf(configs: dict[str, dict], states: dict[str, dict]):
    """(config, head, numpy params) from HF config and state dicts keyed "model", or "discriminator" and
    "generator" for a joint ELECTRA checkpoint."""
    if "model" in states:
        state = states["model"]
        config = state_dict.config_from_hf(configs["model"], pooler=state_dict.has_pooler(state))
        head = state_dict.detect_head(state, config.family)
        return config, head, state_dict.params_from_hf(state, config, head)
    config = state_dict.config_from_hf(configs["discriminator"], pooler=False)
    generator = state_dict.config_from_hf(configs["generator"], pooler=False)
    config.generator.update({key: generator[key] for key in config.generator})
    return config, "both", state_dict.electra_params_from_hf(states["discriminator"], states["generator"], config)


def check_position_numbering(config, head: str, params, config_file: storage.Path) -> None:
    """Refuse a config.json that says roberta over weights numbering positions from 0 (BERT's, e.g. MiniLM saved
    without its 'bert.' prefix): they would load with every position shifted by pad_token_id + 1, silently. RoBERTa
    never trains row pad_token_id of its position table (padding only: HF and fairseq keep it at zero, bert_jax near
    its initial scale), so that row standing well above the others is a trained position of another family."""
    if not families.of(config).position_offset:
        return
    table = narrow(params, config, head, "backbone")[0]["embeddings"]["position_embeddings"]["embedding"]
    norms = np.linalg.norm(np.asarray(table, np.float32), axis=-1)
    pad = config.pad_token_id
    padding_row, typical_row = float(norms[pad]), float(np.median(norms[pad + 1:]))
    if padding_row > 2 * typical_row:
        raise LoadError(f'{config_file} says "model_type": "roberta", but row {pad} of '
                        f"embeddings.position_embeddings.weight, RoBERTa's never-trained padding position "
                        f"(pad_token_id={pad}), is trained (norm {padding_row:.2f}, other rows' median "
                        f"{typical_row:.2f}): these weights number positions from 0. If the model is a BERT (e.g. "
                        'MiniLM), set "model_type": "bert" in config.json')


def read_hf_weights(directory: storage.Path) -> dict[str, np.ndarray]:
    """An HF directory's tensors, from model.safetensors, a sharded safetensors index, or pytorch_model.bin."""
    single, index, legacy = (directory / name for name in HF_WEIGHTS)
    if single.exists():
        return read_safetensors(single)
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise LoadError(f"{index}: has no \"weight_map\" of tensor names to files; download it again")
        shards = sorted(set(weight_map.values()))
        missing = [shard for shard in shards if not (directory / shard).exists()]
        if missing:
            raise LoadError(f"{index} names files that are not in {directory}: {', '.join(missing)}; download them")
        return {name: array for shard in shards for name, array in read_safetensors(directory / shard).items()}
    if legacy.exists():
        return read_pytorch_pickle(legacy)
    raise LoadError(f"{directory}: has config.json but no weights ({', '.join(HF_WEIGHTS)})")


def read_pytorch_pickle(file: storage.Path) -> dict[str, np.ndarray]:
    """A pytorch_model.bin's tensors through torch's weights-only reader, which runs no code from the file. A
    pickle it refuses (objects besides tensors: an old export, or a malicious file) and a damaged file are one
    LoadError each; torch's own message is left out, since it suggests the unsafe way to load the file."""
    try:
        import torch  # only for this legacy format; safetensors needs no torch
    except ImportError as e:
        raise LoadError(f"{file}: reading pytorch_model.bin needs torch; install it or use safetensors") from e
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. torch's note on the pickle protocol
            state = torch.load(io.BytesIO(file.read_bytes()), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise LoadError(f"{file}: refused, {refused_pickle_content(e)}; reading such a file can run code from it. "
                        "Where the file is trusted, convert it to safetensors with transformers (from_pretrained, "
                        "then save_pretrained) and load that folder") from e
    except Exception as e:  # noqa: BLE001 - torch's zip and pickle readers raise RuntimeError, EOFError, KeyError...
        raise damaged_weights(file, "PyTorch", e) from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise LoadError(f"{file}: holds a {type(state).__name__}, not a state dict of tensors; convert the model to "
                        "safetensors with transformers (from_pretrained, then save_pretrained)")
    return {name: tensor.float().numpy() for name, tensor in state.items()}


def refused_pickle_content(error: BaseException) -> str:
    """What torch's weights-only reader refused, from its message, without the rest of that message."""
    text = str(error)
    # torch < 2.13: "Unsupported global: GLOBAL numpy...."; torch 2.13: "unsupported GLOBAL posix.system whose
    # module posix is blocked"
    if found := re.search(r"[Uu]nsupported (?:global: )?GLOBAL ([\w.]+)", text):
        return f"it holds objects besides tensors (it calls {found.group(1)})"
    if found := re.search(r"Unsupported operand (\d+)", text):
        return (f"torch's weights-only reader does not accept it (pickle instruction {found.group(1)}): it is damaged "
                "or holds objects besides tensors")
    return "it holds objects besides tensors"


def damaged_weights(file: storage.Path, kind: str, error: BaseException) -> LoadError:
    """One line for a weight file that cannot be parsed: truncated, corrupt or not a weight file at all."""
    sentence = checkpoints.first_line(error, limit=120).split(". ")[0]
    cause = f"{type(error).__name__}: {sentence}" if str(error).strip() else type(error).__name__
    return LoadError(f"{file}: cannot read this {kind} file ({cause}); it is truncated, corrupt or not a {kind} "
                     "file — download or export it again")


def read_safetensors(file: storage.Path) -> dict[str, np.ndarray]:
    data = file.read_bytes()  # whole, as a bucket gives it; the arrays are copies either way
    try:
        return safetensors.numpy.load(data)
    except Exception as e:  # noqa: BLE001 - SafetensorError, and e.g. a TypeError for a dtype numpy lacks
        raise damaged_weights(file, "safetensors", e) from e


def _read_json(file: storage.Path) -> dict:
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise LoadError(f"{file}: not valid JSON ({e})") from e


def workdir_and_step(path: storage.Path) -> tuple[storage.Path | None, int | None]:
    """A bert_jax workdir given as itself, its checkpoints/ folder or one checkpoints/<step>/ (None if not one)."""
    if path.name.isdigit() and path.parent.name == CHECKPOINT_DIR:
        workdir, step = path.parent.parent, int(path.name)
    else:
        workdir, step = (path.parent if path.name == CHECKPOINT_DIR else path), None
    config_file = workdir / CONFIG_FILE
    if config_file.exists() and "model" in _read_json(config_file):
        return workdir, step
    return None, None


def _workdir_config(workdir: storage.Path):
    """(model config, head) from a workdir's config.json."""
    saved = _read_json(workdir / CONFIG_FILE)
    config = config_lib.model_config(**saved["model"])
    config_lib.validate_model_config(config)
    # Exports written before "head" was the one word for it call it "task".
    head = saved.get("head") or saved.get("task") or modeling.objective_head(saved.get("objective"), config)
    if head not in modeling.HEADS:
        raise LoadError(f"{workdir / CONFIG_FILE}: objective={saved.get('objective')!r} is not one of "
                        f"{tuple(modeling.HEAD_OF_OBJECTIVE)} and no head is given")
    return config, head


def read_workdir(workdir: storage.Path, step: int | None, mesh=None):
    """(config, head, params) restored from the latest (or given) step, straight onto the wanted shardings."""
    import orbax.checkpoint as ocp

    config, head = _workdir_config(workdir)
    with ocp.CheckpointManager(workdir / CHECKPOINT_DIR, item_names=("params", "train_state")) as manager:
        steps = sorted(manager.all_steps())  # the committed ones
    if not steps:
        raise LoadError(f"{workdir / CHECKPOINT_DIR}: no checkpoint saved yet")
    step = steps[-1] if step is None else step
    folder = workdir / CHECKPOINT_DIR / str(step)
    # The "params" item alone, through its own handler: a reader never opens train_state, and Orbax does not warn
    # about an item it was not asked to restore.
    handler = ocp.StandardCheckpointHandler()
    try:
        with _read_errors_named(folder, step, steps):
            stored = handler.metadata(folder / "params")
        target = abstract_target(modeling.model_for_head(config, head), mesh)
        target = checkpoints.unpadded_vocab_target(target, checkpoints.stored_vocab_rows(stored.tree))
        try:  # compare the stored shapes first, for an error that names the parameters
            state_dict.check_shapes(stored.tree, target)
        except state_dict.ConversionError as e:
            raise LoadError(f"{folder}: params do not match config.json: {e}") from e
        with _read_errors_named(folder, step, steps):
            params = handler.restore(folder / "params", args=ocp.args.StandardRestore(target))
    finally:
        handler.close()
    return config, head, pad_vocab(params, config)


@contextlib.contextmanager
def _read_errors_named(folder: storage.Path, step: int, steps: list[int]):
    """Orbax's and TensorStore's read errors (a file of the step truncated or missing) as one LoadError naming the
    step's folder and another step to load; no narrower exception type covers them all."""
    checkpoints.quiet_reported_orbax_errors()
    try:
        yield
    except Exception as error:  # TensorStore, JSON and Orbax raise their own types, bare Exception too
        others = [s for s in steps if s != step]
        instead = f"load another step ({folder.parent / str(others[-1])})" if others else "save or copy it again"
        raise LoadError(f"{folder}: cannot read the checkpoint of step {step} "
                        f"({checkpoints.unreadable_reason(error)}); {instead}") from error


def _workdir_tokenizer(workdir: storage.Path) -> tokenizer_lib.Tokenizer | None:
    """The tokenizer a training config names (config.data.tokenizer_kind/tokenizer_path), if it exists here, or the
    copy an embedding run keeps in tokenizer/."""
    if (workdir / TOKENIZER_DIR).is_dir():
        return find_tokenizer(workdir / TOKENIZER_DIR)
    data = _read_json(workdir / CONFIG_FILE).get("data") or {}
    if not data.get("tokenizer_path"):
        return None
    path = input_config.resolve_path(data["tokenizer_path"])  # presets name files of the repository
    if not path.exists():
        return None
    return tokenizer_lib.load_tokenizer(data["tokenizer_kind"], path, data.get("lowercase", True))


def find_tokenizer(directory: storage.Path, found: tokenizer_lib.Tokenizer | None = None):
    """The tokenizer stored in a checkpoint directory: tokenizer.json (exact HF pipeline), else vocab.txt,
    vocab.json + merges.txt or a sentencepiece *.model. None, with a warning, if there is none."""
    if found is not None:
        return found
    json_file, vocab, bpe_vocab = directory / "tokenizer.json", directory / "vocab.txt", directory / "vocab.json"
    spm_models = sorted(directory.glob("*.model"))
    if json_file.exists():
        return tokenizer_lib.load_tokenizer_json(json_file)
    if vocab.exists():
        config_file = directory / "tokenizer_config.json"
        lowercase = _read_json(config_file).get("do_lower_case", True) if config_file.exists() else True
        return tokenizer_lib.load_tokenizer("wordpiece", vocab, lowercase=lowercase)
    if bpe_vocab.exists():
        return tokenizer_lib.load_tokenizer("bpe", directory)
    if spm_models:
        return tokenizer_lib.load_tokenizer("sentencepiece", spm_models[0])
    warnings.warn(f"{directory}: no tokenizer files (tokenizer.json, vocab.txt, vocab.json + merges.txt or *.model); "
                  ".tokenizer is None and .embed/.fill_mask need one — .encode takes token ids")
    return None


# ----------------------------------------------------------------------------------------------------------- save


def save_pretrained(obj: Pretrained, path, format: str = "hf", step: int = 0) -> storage.Path:
    """Write `obj` as an HF directory (config.json + model.safetensors; ELECTRA's `both` as discriminator/ and
    generator/ subdirectories), as a sentence-transformers folder (its backbone as an HF directory, plus its pooling:
    obj.pooling, else mean pooling as sentence-transformers gives a plain HF folder) or as a bert_jax workdir
    (config.json + checkpoints/<step>/params). Tokenizer files are copied along, with the HF tokenizer files they
    lack (copy_tokenizer). Written to a hidden sibling folder and moved into place, so a failure leaves nothing
    behind. For a bucket the sibling is in the bucket too: Orbax marks a finished step there with a file, which a
    local save would lack."""
    path = storage.orbax_path(path)
    if format not in FORMATS:
        raise ValueError(f"format={format!r}; choose one of {FORMATS}")
    check_output_free(path)
    staging = storage.make_dirs(path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        if format == "hf":
            write_hf(obj, staging)
        elif format == "sentence-transformers":
            write_sentence_transformers(obj, staging)
        else:
            write_bert_jax(obj, staging, step)
        if path.exists():
            path.rmdir()
        storage.move_tree(staging, path)
    finally:
        if staging.exists():
            staging.rmtree()
    return path


def check_output_free(path: storage.PathLike) -> None:
    """Raise OutputExistsError unless `path` is absent or an empty folder (callers check before a long load)."""
    path = storage.as_path(path)
    storage.check_bucket(path)
    if path.exists() and any(path.iterdir()):
        raise OutputExistsError(f"{path} exists and is not empty; choose a new output path")


def host_params(obj: Pretrained) -> dict:
    """Params as numpy in the unscanned layout that the HF tables read."""
    return to_unscanned_layout(jax.tree.map(np.asarray, jax.device_get(obj.params)))


def write_hf(obj: Pretrained, directory: storage.Path) -> None:
    params = host_params(obj)
    special = obj.tokenizer.special if obj.tokenizer is not None else None
    if obj.head == "both":
        states = state_dict.electra_params_to_hf(params, obj.config)
        configs = {"discriminator": obj.config, "generator": config_lib.generator_config(obj.config)}
        for part in ("discriminator", "generator"):
            _write_hf_model(directory / part, configs[part], state_dict.config_to_hf(configs[part], part, special),
                            states[part], obj.tokenizer)
        return
    head = obj.head
    hf_config = state_dict.config_to_hf(obj.config, head, special)  # first: it refuses what HF's classes cannot hold
    hf_base = "" if head == "backbone" else None  # HF's base models (BertModel, ...) save without a prefix
    _write_hf_model(directory, obj.config, hf_config, state_dict.params_to_hf(params, obj.config, head, hf_base),
                    obj.tokenizer)


def write_sentence_transformers(obj: Pretrained, directory: storage.Path) -> None:
    """The backbone as HF files (what sentence-transformers' Transformer module loads) and the pooling files."""
    params, config = narrow(obj.params, obj.config, obj.head, "backbone")
    write_hf(dataclasses.replace(obj, params=params, config=config, head="backbone"), directory)
    pooling = obj.pooling or sentence_embedding.DEFAULT_EXPORT_POOLING
    sentence_embedding.write_folder_files(directory, pooling, config.hidden_size,
                                          pooling.max_seq_length or max_tokens(config))


def _write_hf_model(directory: storage.Path, config, hf_config: dict, state: dict, tokenizer) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    (directory / "model.safetensors").write_bytes(safetensors.numpy.save(state, metadata={"format": "pt"}))
    copy_tokenizer(tokenizer, directory, config)


def write_bert_jax(obj: Pretrained, directory: storage.Path, step: int) -> None:
    """The trainer's workdir layout, with only the "params" item (a conversion has no optimizer state)."""
    import orbax.checkpoint as ocp

    objective = {"pretraining": families.of(obj.config).objective, "masked_lm": "mlm", "generator": "mlm",
                 "both": "rtd"}.get(obj.head)
    saved = {"model": obj.config.to_dict(), "objective": objective, "head": obj.head,
             **sentence_embedding.run_keys(obj.pooling)}
    (directory / CONFIG_FILE).write_text(json.dumps(saved, indent=2) + "\n")
    with ocp.CheckpointManager(directory / CHECKPOINT_DIR) as manager:
        manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(obj.params)))
        manager.wait_until_finished()
    copy_tokenizer(obj.tokenizer, directory, obj.config)


def copy_tokenizer(tokenizer, directory: storage.Path, config: ml_collections.ConfigDict) -> None:
    """Copy the tokenizer's file(s) and the HF tokenizer files beside them (small files: read whole, so that
    either side may be in a bucket), and write the HF files they lack for a model of `config`
    (tokenizers.hf_tokenizer_files: without them casing is lost and AutoTokenizer may not load the folder)."""
    if tokenizer is None:
        return
    source = storage.as_path(tokenizer.path)
    folder = source if source.is_dir() else source.parent
    files = {folder / name for name in TOKENIZER_FILES} | ({source} if source.is_file() else set())
    for file in sorted(f for f in files if f.exists()):
        (directory / file.name).write_bytes(file.read_bytes())
    family = families.of(config)
    written = tokenizer_lib.hf_tokenizer_files(tokenizer, family.pair_separators, family.pair_token_types,
                                               max_tokens(config))
    for name, text in written.items():
        if not (directory / name).exists():
            (directory / name).write_text(text + "\n")
