"""One way to name a dataset (bert_jax.data_sources): GLUE and SQuAD give the same examples and features from the
bundled TSV and JSON samples, from parquet files in the hub's layout (written here with pyarrow) and from TFDS
datasets that TFDS's own builders make out of the same files; prepare reads a hub corpus's parquet shards as it
reads JSON lines; missing data is one line naming the command that fetches it."""
import json
import pathlib
import re
import shutil
import tempfile
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_jax import config_lib, data_sources, finetune
from bert_jax.evaluation import similarity
from bert_jax.input_pipeline import documents, prepare, prepare_units
from bert_jax.input_pipeline.config import REPO_ROOT
from bert_jax.input_pipeline.tokenizers import load_tokenizer
from bert_jax.tasks import glue, squad
from bert_jax.tasks.text import encode_texts

DATA = REPO_ROOT / "data"
SQUAD_SAMPLE = DATA / "squad" / "dev-v1.1-sample.json"
VOCAB = DATA / "bert-base-uncased" / "vocab.txt"
RTE_LABELS = ["entailment", "not_entailment"]  # the ClassLabel names of TFDS and the hub, in their order


def tsv_rows(path):
    """The rows of a GLUE TSV as lists of fields, header dropped (split here on tabs, not by bert_jax)."""
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]


def write_parquet(path, columns):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=10)  # several row groups, as large files have


@pytest.fixture(scope="module")
def glue_hub(tmp_path_factory):
    """The bundled RTE and STS-B samples laid out as the hub's nyu-mll/glue: rte/train-00000-of-00001.parquet, ...
    with the hub's columns (sentence1, sentence2, label as a class index or score, -1 in test; idx)."""
    root = tmp_path_factory.mktemp("hub") / "glue"
    for tsv in ("train", "dev", "test"):
        rows = tsv_rows(DATA / "glue" / "RTE" / f"{tsv}.tsv")
        labels = [RTE_LABELS.index(r[3]) for r in rows] if tsv != "test" else [-1] * len(rows)
        split = {"dev": "validation"}.get(tsv, tsv)
        write_parquet(root / "rte" / f"{split}-00000-of-00001.parquet",
                      {"sentence1": [r[1] for r in rows], "sentence2": [r[2] for r in rows], "label": labels,
                       "idx": [int(r[0]) for r in rows]})
    for tsv, split in (("train", "train"), ("dev", "validation")):
        rows = tsv_rows(DATA / "glue" / "STS-B" / f"{tsv}.tsv")
        write_parquet(root / "stsb" / f"{split}-00000-of-00001.parquet",
                      {"sentence1": [r[7] for r in rows], "sentence2": [r[8] for r in rows],
                       "label": pa.array([float(r[9]) for r in rows], pa.float32()), "idx": list(range(len(rows)))})
    return root


@pytest.fixture(scope="module")
def squad_hub(tmp_path_factory):
    """The bundled SQuAD sample as the hub's rajpurkar/squad: plain_text/{train,validation}-00000-of-00001.parquet
    with answers as a struct of lists, converted here from the JSON."""
    root = tmp_path_factory.mktemp("hub") / "squad"
    rows = [dict(id=qa["id"], title=article["title"], context=paragraph["context"], question=qa["question"],
                 answers={"text": [a["text"] for a in qa["answers"]],
                          "answer_start": [a["answer_start"] for a in qa["answers"]]})
            for article in json.loads(SQUAD_SAMPLE.read_text())["data"] for paragraph in article["paragraphs"]
            for qa in paragraph["qas"]]
    for split in ("train", "validation"):
        path = root / "plain_text" / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), path)
    return root


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    """TFDS glue/rte and squad/v1.1 built by TFDS's own builders from the bundled files (the download replaced by
    those files: glue/rte reads RTE/*.tsv as in GLUE's zip, squad/v1.1 the sample as both train and dev)."""
    import tensorflow_datasets as tfds

    root = tmp_path_factory.mktemp("tfds")
    glue_zip = root / "downloads" / "glue"
    shutil.copytree(DATA / "glue" / "RTE", glue_zip / "RTE")
    downloads = {"glue/rte": str(glue_zip), "squad/v1.1": {"train": str(SQUAD_SAMPLE), "dev": str(SQUAD_SAMPLE)}}
    for name, files in downloads.items():
        with (mock.patch.object(tfds.download.DownloadManager, "download_and_extract", lambda self, url: files),
              data_sources.quiet_tfds()):  # a builder of a dataset not built yet leaves a folder in /tmp
            tfds.builder(name, data_dir=str(root / "built")).download_and_prepare()
    return str(root / "built")


def test_rte_is_the_same_from_tsv_the_hub_and_tfds(glue_hub, tfds_dir):
    sources = {"tsv": str(DATA / "glue" / "RTE"), "hub root": str(glue_hub), "hub folder": str(glue_hub / "rte"),
               "tfds:glue": "tfds:glue", "tfds:glue/rte": "tfds:glue/rte"}
    task, tokenizer = glue.get_task("rte"), load_tokenizer("wordpiece", VOCAB)
    for split, rows in (("train", 64), ("dev", 32), ("test", 32)):
        (tsv,) = glue.load_split(task, split, sources["tsv"])
        assert len(tsv.text_a) == rows and (tsv.labels is None) == (split == "test")
        features = encode_texts(tokenizer, "bert", tsv.text_a, tsv.text_b, 128)[0]
        for name, source in sources.items():
            (other,) = glue.load_split(task, split, source, tfds_dir)
            assert (other.text_a, other.text_b) == (tsv.text_a, tsv.text_b), (name, split)
            np.testing.assert_array_equal(other.labels, tsv.labels, err_msg=f"{name} {split}")
            for key, value in encode_texts(tokenizer, "bert", other.text_a, other.text_b, 128)[0].items():
                np.testing.assert_array_equal(value, features[key], err_msg=f"{name} {split} {key}")
        assert glue.has_test_files(task, source)


def test_stsb_scores_read_alike_by_the_similarity_command(glue_hub):
    tsv = similarity.read_pairs(str(DATA / "glue" / "STS-B" / "dev.tsv"))
    for data in (DATA / "glue" / "STS-B", glue_hub, glue_hub / "stsb" / "validation-00000-of-00001.parquet"):
        pairs = similarity.read_pairs(str(data))
        assert (pairs.text_a, pairs.text_b) == (tsv.text_a, tsv.text_b) and len(pairs.text_a) == 32
        np.testing.assert_array_equal(pairs.labels, tsv.labels)
    assert tsv.labels.dtype == np.float32 and tsv.labels[0] == 5.0
    assert not glue.has_test_files(glue.get_task("stsb"), str(glue_hub))  # the samples have no test split


def squad_config(**overrides):
    config = config_lib.load_preset("squad", "v1.1")
    config.update(overrides)
    return config


def test_squad_is_the_same_from_json_the_hub_and_tfds(squad_hub, tfds_dir, tmp_path):
    for name in ("train-v1.1.json", "dev-v1.1.json"):  # the official download's names
        shutil.copy(SQUAD_SAMPLE, tmp_path / name)
    json_file = squad.questions_of(squad.read_articles(SQUAD_SAMPLE), "sample")
    assert len(json_file) == 55
    configs = {"JSON folder": squad_config(data_dir=str(tmp_path)), "hub root": squad_config(data_dir=str(squad_hub)),
               "hub file": squad_config(train_file=str(squad_hub / "plain_text" / "train-00000-of-00001.parquet"),
                                        predict_file=str(squad_hub / "plain_text" / "validation-00000-of-00001"
                                                                                    ".parquet")),
               "JSON files": squad_config(train_file=str(SQUAD_SAMPLE), predict_file=str(SQUAD_SAMPLE)),
               "tfds": squad_config(tfds_data_dir=tfds_dir)}  # the default data_dir, tfds:squad
    tokenizer = load_tokenizer("wordpiece", VOCAB)
    by_id = lambda questions: sorted(questions, key=lambda q: q.qid)
    features = lambda questions: squad.build_features(squad.examples_of(by_id(questions), False, "test"), tokenizer,
                                                      "bert", 128, 64, 32)
    expected = features(json_file)
    for name, config in configs.items():
        for split in ("train", "validation"):
            questions, _ = finetune.squad_split(config, split)
            if name == "tfds":  # TFDS stores questions shuffled, with nothing that gives the file's order back
                assert by_id(questions) == by_id(json_file)
            else:
                assert questions == json_file, (name, split)
        for key, value in features(questions).items():
            np.testing.assert_array_equal(value, expected[key], err_msg=f"{name} {key}")


def test_missing_glue_and_squad_name_the_commands_that_fetch_them(tmp_path):
    rte = glue.get_task("rte")
    absent = str(tmp_path / "glue")
    with pytest.raises(glue.GlueDataError) as error:
        glue.load_split(rte, "train", absent)
    assert str(error.value) == (
        f"--config.data_dir={absent}: no GLUE RTE data there (neither its TSVs nor the hub's rte/*.parquet); "
        f"download it: hf download nyu-mll/glue --repo-type=dataset --include='rte/*' --local-dir={absent} (or pip "
        "install -e '.[data]' && tfds build glue/rte and --config.data_dir=tfds:glue)")
    with pytest.raises(glue.GlueDataError, match=re.escape(f"--data={absent}: no GLUE STS-B data there")):
        similarity.read_pairs(absent)
    built = str(tmp_path / "tfds")
    tfds_temp_folders = lambda: set(pathlib.Path(tempfile.gettempdir()).glob("tmp*tfds"))
    before = tfds_temp_folders()
    with pytest.raises(data_sources.DataSourceError) as error:
        glue.load_split(rte, "dev", "tfds:glue", built)
    assert tfds_temp_folders() <= before  # TFDS's builder makes an empty one for a dataset not built, left there
    assert str(error.value) == (f"--config.data_dir=tfds:glue/rte: TFDS glue/rte is not built in {built}; fetch it "
                                f"where there is network: pip install -e '.[data]' && tfds build glue/rte "
                                f"--data_dir={built}")
    with pytest.raises(squad.SquadDataError) as error:
        finetune.squad_split(squad_config(data_dir=absent), "validation")
    assert str(error.value) == (
        f"--config.data_dir={absent}: no SQuAD v1.1 validation data there (neither dev-v1.1.json nor the hub's "
        f"plain_text/validation-*.parquet); download it: hf download rajpurkar/squad --repo-type=dataset "
        f"--local-dir={absent} (or curl --create-dirs -o {absent}/dev-v1.1.json "
        "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v1.1.json)")


def test_a_source_given_for_several_tasks_names_what_it_lacks_at_once(glue_hub, tfds_dir):
    tasks = [glue.get_task(t) for t in ("rte", "stsb", "cola", "sst2")]
    with pytest.raises(glue.GlueDataError, match=re.escape(
            f"--glue={glue_hub} lacks CoLA, SST-2 (neither GLUE TSV folders such as CoLA/train.tsv nor the hub's "
            f"cola/*.parquet); download them: hf download nyu-mll/glue --repo-type=dataset --local-dir={glue_hub}")):
        glue.check_tasks(tasks, str(glue_hub), None, "--glue")
    glue.check_tasks(tasks[:2], str(glue_hub), None, "--glue")
    glue.check_tasks(tasks[:1], str(DATA / "glue"), None, "--glue")  # GLUE's task folders (RTE/, STS-B/)
    with pytest.raises(glue.GlueDataError, match=re.escape(
            f"--glue=tfds:glue: TFDS glue/stsb, glue/cola, glue/sst2 not built; fetch them where there is network: "
            f"pip install -e '.[data]' && tfds build glue/stsb glue/cola glue/sst2 --data_dir={tfds_dir}")):
        glue.check_tasks(tasks, "tfds:glue", tfds_dir, "--glue")


@pytest.mark.parametrize("data_dir, error", [
    ("tfds:glue/rte:train", "--config.data_dir=tfds:glue/rte:train: RTE reads its train, validation and test splits "
                            "itself; drop ':train'"),
    ("tfds:glue/mrpc", "--config.data_dir=tfds:glue/mrpc: that is GLUE's mrpc, not RTE; pass tfds:glue or "
                       "tfds:glue/rte"),
    ("tfds:", "'tfds:' names no TFDS dataset; write tfds:NAME[:SPLIT], e.g. tfds:glue/rte"),
])
def test_tfds_names_that_cannot_be_a_task(data_dir, error):
    with pytest.raises((glue.GlueDataError, data_sources.DataSourceError), match=f"^{re.escape(error)}$"):
        glue.load_split(glue.get_task("rte"), "train", data_dir)


def test_tfds_names_carry_a_version_and_a_split():
    assert data_sources.tfds_name("tfds:glue/rte:2.0.0:validation[:50%]") == data_sources.TfdsName(
        "glue/rte:2.0.0", "validation[:50%]")
    assert data_sources.tfds_name("tfds:c4/en") == data_sources.TfdsName("c4/en", "")
    assert data_sources.tfds_name("glue/RTE") is None


def book_documents(lines=300, per_document=20):
    """Documents of 20 sentences each (newline-separated, as a JSON line's or a parquet row's text) from a bundled
    book's first lines."""
    text = (DATA / "corpus" / "chesterton-brown.txt").read_text(encoding="utf-8").splitlines()
    sentences = [line for line in text if line.strip()][:lines]
    return ["\n".join(sentences[i:i + per_document]) for i in range(0, lines, per_document)]


def test_prepare_reads_a_hub_corpus_folder_as_it_reads_json_lines(tmp_path):
    docs = book_documents()
    half = len(docs) // 2
    hub = tmp_path / "fineweb" / "sample" / "10BT"  # FineWeb's layout: a config folder of numbered shards
    write_parquet(hub / "000_00000.parquet", {"text": docs[:half], "id": list(range(half))})
    write_parquet(hub / "001_00000.parquet", {"text": [*docs[half:], None], "id": list(range(half, len(docs) + 1))})
    (tmp_path / "pages.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    job = lambda inputs, out: prepare.work_units(inputs, tmp_path / out, str(VOCAB), "wordpiece", True, 1_000)
    parquet_summary = prepare.prepare(job([str(hub)], "from_parquet"), num_workers=1)
    json_summary = prepare.prepare(job([str(tmp_path / "pages.jsonl")], "from_json"), num_workers=1)
    shards = lambda out: [d for p in sorted((tmp_path / out).glob("*.tfrecord")) for d in documents.read_shards([p])]
    parquet_docs, json_docs = shards("from_parquet"), shards("from_json")
    assert len(parquet_docs) == parquet_summary["documents"] == json_summary["documents"] == 15
    for (tokens, lengths), (json_tokens, json_lengths) in zip(parquet_docs, json_docs, strict=True):
        np.testing.assert_array_equal(tokens, json_tokens)
        np.testing.assert_array_equal(lengths, json_lengths)
    assert parquet_summary["invalid_records"] == 1  # the null text
    assert parquet_summary["where"]["invalid_records"] == [f"{hub / '001_00000.parquet'}:row {len(docs) - half}"]
    with pytest.raises(data_sources.DataSourceError, match=re.escape(
            f"{hub / '000_00000.parquet'}: no column 'content' (it has text, id); name the text column with "
            "--text_key")):
        list(documents.read_documents(hub / "000_00000.parquet", documents.new_counts(), "content"))
    with pytest.raises(prepare_units.PrepareError, match="a folder without \\*.parquet files"):
        job([str(tmp_path / "fineweb")], "nothing")  # the repository's root: its configs are subfolders


def test_prepare_reads_tfds_splits_in_slices(tfds_dir, tmp_path):
    units = prepare.work_units(["tfds:glue/rte:validation"], tmp_path / "out", str(VOCAB), "wordpiece", True, 10,
                               text_key="sentence1", tfds_data_dir=tfds_dir, tfds_units=2)
    assert [(u["name"], u["split"], u["index"], u["count"]) for u in units] == [
        ("glue/rte", "validation", 0, 2), ("glue/rte", "validation", 1, 2)]
    summary = prepare.prepare(units, num_workers=1)
    assert summary["one_sentence_documents"] == 32  # each sentence1 is one line: read, then skipped as too short
    with pytest.raises(data_sources.DataSourceError, match=re.escape(
            "tfds:glue/rte:dev: TFDS glue/rte has no split 'dev', only ")):
        prepare.work_units(["tfds:glue/rte:dev"], tmp_path / "out", str(VOCAB), "wordpiece", True, 10,
                           tfds_data_dir=tfds_dir)
