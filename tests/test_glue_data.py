"""GLUE readers on real TSV samples, bad rows counted and reported, pair packing, submission files and metrics."""
import pathlib
import re

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.data_sources import DataSourceError
from bert_jax.evaluation import glue_metrics
from bert_jax.tasks import glue
from bert_jax.tasks.text import pack, truncate_longest_first
from bert_jax.input_pipeline.tokenizers import SpecialIds

DATA = pathlib.Path(__file__).parents[1] / "data" / "glue"


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


RTE_HEADER = "index\tsentence1\tsentence2\tlabel"


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("bad_row, error", [
    ("1\tonly two columns", ":3: 2 tab-separated columns instead of the header's 4 columns; fix or remove this row"),
    ("", ":3: a blank line instead of the header's 4 columns"),
    ("1\ta\tb\tmaybe", ":3: label 'maybe' is not one of entailment, not_entailment; fix or remove this row"),
])
def test_a_bad_row_is_an_error_naming_file_and_line(tmp_path, bad_row, error):
    path = write_lines(tmp_path / "train.tsv", [RTE_HEADER, "0\ta\tb\tentailment", bad_row, "2\ta\tb\tentailment"])
    with pytest.raises(glue.GlueDataError, match=f"^{re.escape(str(path) + error)}"):
        glue.read_tsv(glue.get_task("rte"), path)


def test_files_without_header_count_columns_by_task(tmp_path):
    path = write_lines(tmp_path / "train.tsv", ["gj04\t1\t\tGood.", "gj04\t0\t*"])
    with pytest.raises(glue.GlueDataError, match=re.escape(f"{path}:2: 3 tab-separated columns instead of CoLA's 4")):
        glue.read_tsv(glue.get_task("cola"), path)


def test_qqp_skips_broken_rows_as_hf_does_and_counts_them(tmp_path, caplog):
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
    path = write_lines(tmp_path / "train.tsv", [header, "0\t1\t2\tWhy?\tHow?\t0", "1\t3\t4\tWhat is",
                                                 "a line break?\tWhat?\t1", "2\t5\t6\tWho?\tWhom?\t1"])
    part = glue.read_tsv(glue.get_task("qqp"), path)
    assert part.text_a == ["Why?", "Who?"] and part.labels.tolist() == [0, 1]
    assert f"{path}: skipped 2 of 4 rows that do not have the header's 6 columns, as HF's QQP processor skips them " \
           "(first: line 3)" in caplog.text
    broken = write_lines(path, [header, "1\t3\t4\tWhat is", "a line break?\tWhat?\t1"])
    with pytest.raises(glue.GlueDataError, match="all its 2 rows are broken"):
        glue.read_tsv(glue.get_task("qqp"), broken)
    with pytest.raises(glue.GlueDataError, match=re.escape(f"{path}:2: label '2' is not one of 0, 1")):
        glue.read_tsv(glue.get_task("qqp"), write_lines(path, [header, "0\t1\t2\tWhy?\tHow?\t2"]))


@pytest.mark.parametrize("content, error", [
    ("", "is empty (0 bytes); download the GLUE RTE files again"),
    (RTE_HEADER + "\n", "has no RTE examples: it holds only a header; pass a GLUE RTE TSV file"),
])
def test_empty_and_header_only_files_are_errors(tmp_path, content, error):
    path = tmp_path / "dev.tsv"
    path.write_text(content)
    with pytest.raises(glue.GlueDataError, match=f"^{re.escape(f'{path} {error}')}$"):
        glue.load_split(glue.get_task("rte"), "dev", str(tmp_path))


def test_regression_scores_outside_0_to_5_are_bad_labels(tmp_path):
    header = "\t".join(["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
                        "sentence2", "score"])
    row = lambda score: "\t".join(["0", "g", "f", "y", "o", "s", "s", "a", "b", score])
    path = tmp_path / "dev.tsv"
    assert glue.read_tsv(glue.get_task("stsb"), write_lines(path, [header, row("3.5")])).labels.tolist() == [3.5]
    for score in ("7", "high"):
        with pytest.raises(glue.GlueDataError, match=re.escape(f"dev.tsv:3: label '{score}' is not a score in [0, 5]")):
            glue.read_tsv(glue.get_task("stsb"), write_lines(path, [header, row("3.5"), row(score)]))


def test_missing_file_says_which_flag_to_pass(tmp_path):
    with pytest.raises(glue.GlueDataError, match="--config.data_dir"):
        glue.load_split(glue.get_task("cola"), "train", str(tmp_path))
    with pytest.raises(glue.GlueDataError, match="unknown GLUE task"):
        glue.get_task("squad")


def test_a_misspelled_folder_is_named_with_the_closest_one_beside_it(tmp_path):
    (tmp_path / "RTE").mkdir()
    with pytest.raises(DataSourceError, match=re.escape(f"--config.data_dir={tmp_path}/RTEE: no such file or folder; "
                                                         f"did you mean {tmp_path}/RTE?")):
        glue.load_split(glue.get_task("rte"), "train", str(tmp_path / "RTEE"))
    with pytest.raises(glue.GlueDataError, match="glue/MRPC: no GLUE MRPC data there .*; download it: hf download "
                                                 "nyu-mll/glue"):
        glue.load_split(glue.get_task("mrpc"), "train", str(tmp_path / "glue" / "MRPC"))


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
    expected = (2 * 1 - 1 * 1) / np.sqrt(3 * 3 * 2 * 2)
    assert glue_metrics.matthews_corrcoef(predictions, labels) == pytest.approx(expected)
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


def test_an_empty_data_dir_says_what_to_name(tmp_path):
    with pytest.raises(glue.GlueDataError, match="--config.data_dir is empty; name the RTE data: .*tfds:glue"):
        glue.load_split(glue.get_task("rte"), "dev", data_dir="", tfds_data_dir=str(tmp_path))


def test_missing_test_files_mean_no_submission_but_a_broken_one_is_read(tmp_path):
    task = glue.get_task("rte")
    assert not glue.has_test_files(task, str(tmp_path))
    (tmp_path / "test.tsv").write_text("")
    assert glue.has_test_files(task, str(tmp_path))
    with pytest.raises(glue.GlueDataError, match="is empty"):
        glue.load_split(task, "test", str(tmp_path))
