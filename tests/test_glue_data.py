"""GLUE readers on real TSV samples, bad rows counted and reported, pair packing, submission files and metrics."""
import logging
import pathlib

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.evaluation import glue_metrics
from bert_jax.tasks import glue
from bert_jax.tasks.text import pack, truncate_longest_first
from bert_jax.input_pipeline.tokenizers import SpecialIds

DATA = pathlib.Path(__file__).parent / "data" / "glue"


@pytest.mark.parametrize("name, folder, split, rows, first_label, has_pair", [
    ("rte", "RTE", "train", 64, 1, True),
    ("RTE", "RTE", "dev", 32, 1, True),
    ("sts-b", "STS-B", "dev", 32, 5.0, True),
    ("mrpc", "MRPC", "dev", 16, 1, True),  # its header starts with a byte-order mark; unbalanced quotes in text
])
def test_reads_real_samples(name, folder, split, rows, first_label, has_pair):
    task = glue.get_task(name)
    (part,) = glue.load_split(task, split, str(DATA / folder))
    assert len(part.text_a) == len(part.labels) == rows
    assert part.labels[0] == first_label
    assert (part.text_b is not None) == has_pair


def test_every_task_has_its_official_metrics():
    expected = {"cola": ("mcc",), "sst2": ("accuracy",), "mrpc": ("f1", "accuracy"), "stsb": ("pearson", "spearman"),
                "qqp": ("f1", "accuracy"), "mnli": ("accuracy",), "qnli": ("accuracy",), "rte": ("accuracy",),
                "wnli": ("accuracy",)}
    assert {k: t.metrics for k, t in glue.TASKS.items()} == expected
    assert glue.submission_names(glue.TASKS["mnli"]) == ("MNLI-m", "MNLI-mm")


def test_bad_rows_are_skipped_counted_and_named(tmp_path, caplog):
    lines = ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment", "1\tonly two columns", "2\ta\tb\tmaybe",
             "3\ta\tb\tnot_entailment", "4\ta\tb\tc\tentailment", "5\ta\tb\tunknown"]
    path = tmp_path / "train.tsv"
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING):
        part = glue.read_tsv(glue.get_task("rte"), path)
    assert part.labels.tolist() == [0, 1]
    messages = [r.getMessage() for r in caplog.records]
    assert any(str(path) in m and "skipped 2 of 6 rows" in m and "4 tab-separated columns" in m and "line 3" in m
               for m in messages), messages
    assert any("skipped 2 of 6 rows" in m and "label outside" in m and "line 4" in m for m in messages), messages


def test_regression_scores_outside_0_to_5_are_bad_labels(tmp_path, caplog):
    header = "\t".join(["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
                        "sentence2", "score"])
    rows = ["\t".join(["0", "g", "f", "y", "o", "s", "s", "a", "b", score]) for score in ("3.5", "7", "high")]
    path = tmp_path / "dev.tsv"
    path.write_text("\n".join([header, *rows]) + "\n")
    part = glue.read_tsv(glue.get_task("stsb"), path)
    assert part.labels.tolist() == [3.5]
    assert "skipped 2 of 3 rows" in caplog.text


def test_missing_file_says_which_flag_to_pass(tmp_path):
    with pytest.raises(glue.GlueDataError, match="--config.data_dir"):
        glue.load_split(glue.get_task("cola"), "train", str(tmp_path))
    with pytest.raises(glue.GlueDataError, match="unknown GLUE task"):
        glue.get_task("squad")


def test_submission_format(tmp_path):
    glue.write_submission(glue.get_task("rte"), np.array([1, 0]), tmp_path / "RTE.tsv")
    glue.write_submission(glue.get_task("stsb"), np.array([5.7, 2.25]), tmp_path / "STS-B.tsv")
    assert (tmp_path / "RTE.tsv").read_text() == "index\tprediction\n0\tnot_entailment\n1\tentailment\n"
    assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t5.000\n1\t2.250\n"


def test_pair_packing_per_family():
    special = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
    assert pack([10, 11], [20], special, "bert") == ([2, 10, 11, 3, 20, 3], [0, 0, 0, 0, 1, 1])
    assert pack([10, 11], [20], special, "roberta") == ([2, 10, 11, 3, 3, 20, 3], [0] * 7)
    assert pack([10], None, special, "albert") == ([2, 10, 3], [0, 0, 0])
    assert truncate_longest_first([1, 2, 3, 4, 5], [6, 7], 4) == ([1, 2], [6, 7])
    assert truncate_longest_first([1, 2], [3, 4, 5], 4) == ([1, 2], [3, 4])


def test_metrics_match_hand_computed_values():
    predictions, labels = [1, 1, 1, 0, 0], [1, 1, 0, 0, 1]  # tp 2, fp 1, tn 1, fn 1
    assert glue_metrics.accuracy(predictions, labels) == pytest.approx(3 / 5)
    assert glue_metrics.f1(predictions, labels) == pytest.approx(2 * 2 / (3 + 3))
    assert glue_metrics.matthews_corrcoef(predictions, labels) == pytest.approx((2 * 1 - 1 * 1) / np.sqrt(3 * 3 * 2 * 2))
    assert glue_metrics.matthews_corrcoef([1, 1], [1, 0]) == 0.0  # an empty confusion row
    # Ties share their mean rank: x ranks [1, 2.5, 2.5, 4], y ranks [1, 3, 2, 4].
    assert glue_metrics.average_ranks([1, 2, 2, 3]).tolist() == [1, 2.5, 2.5, 4]
    assert glue_metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / np.sqrt(4.5 * 5))
    assert glue_metrics.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / np.sqrt(2 * 114 / 9))


def test_correlations_agree_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 6, 200).astype(float), rng.normal(size=200)
    assert glue_metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert glue_metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y).statistic, abs=1e-12)


@pytest.mark.parametrize("preset", [*(f"glue:{name}" for name in glue.TASKS), "squad:v1.1", "squad:v2.0"])
def test_finetune_configs_load_locked(preset):
    family, _, arg = preset.partition(":")
    config = config_lib.load_preset(family, arg)
    assert config.task in (arg, "squad") and config.init == ""
    with pytest.raises(AttributeError, match="learning_rat"):
        config.optimizer.learning_rat = 1.0


def test_unknown_finetune_presets_are_named():
    with pytest.raises(glue.GlueDataError, match="sst5"):
        config_lib.load_preset("glue", "sst5")
    with pytest.raises(config_lib.ConfigError, match="v3"):
        config_lib.load_preset("squad", "v3")


def test_tfds_not_prepared_points_to_data_dir(tmp_path):
    with pytest.raises(glue.GlueDataError, match="not available offline.*--config.data_dir"):
        glue.load_split(glue.get_task("rte"), "dev", data_dir="", tfds_data_dir=str(tmp_path))
