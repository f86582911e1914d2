"""train_tokenizer on big corpora: a uniform sample of sentences from all inputs, drawn in one pass that holds only
the sample, the same for the same seed."""
import gzip
import json
import tracemalloc

from bert_jax.input_pipeline import documents, tokenizers, train_tokenizer


def test_the_sample_is_uniform_over_the_whole_stream():
    sample = train_tokenizer.sample_sentences((str(i) for i in range(50_000)), 5_000, seed=0)
    assert len(sample) == len(set(sample)) == 5_000
    per_tenth = [0] * 10
    for sentence in sample:
        per_tenth[int(sentence) // 5_000] += 1
    assert all(400 < n < 600 for n in per_tenth), per_tenth  # 500 expected in each tenth of the stream


def test_the_sample_is_the_same_for_a_seed_and_all_of_a_short_stream():
    sentences = [f"sentence {i}" for i in range(1_000)]
    first = train_tokenizer.sample_sentences(iter(sentences), 100, seed=3)
    assert first == train_tokenizer.sample_sentences(iter(sentences), 100, seed=3)
    assert first != train_tokenizer.sample_sentences(iter(sentences), 100, seed=4)
    assert train_tokenizer.sample_sentences(iter(sentences[:50]), 100, seed=3) == sentences[:50]


def test_memory_holds_the_sample_not_the_stream():
    tracemalloc.start()
    try:
        sample = train_tokenizer.sample_sentences((f"sentence number {i} " * 10 for i in range(300_000)), 100, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(sample) == 100 and peak < 2**20, f"{peak / 2**20:.1f} MiB for a 60 MB stream"


def test_trains_on_a_sample_of_text_and_json_lines(tmp_path):
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"The cat sat on the mat.\nA dog ran.\n\nBirds sing.\n"))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"content": f"Line {i} of text.\nMore words here."}) + "\n"
                                              for i in range(200)))
    counts = documents.new_counts()
    lines = list(train_tokenizer.text_lines([tmp_path / "a.txt.gz", tmp_path / "b.jsonl"], counts, "content"))
    assert len(lines) == 403 and lines[:4] == ["The cat sat on the mat.", "A dog ran.", "Birds sing.",
                                               "Line 0 of text."]
    path = train_tokenizer.train("wordpiece", [tmp_path / "a.txt.gz", tmp_path / "b.jsonl"], 120, tmp_path / "out",
                                 sample_size=50, text_key="content")
    vocab = path.read_text().split()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and "words" in vocab
    assert tokenizers.load_tokenizer("wordpiece", path).vocab_size == len(vocab) <= 120
