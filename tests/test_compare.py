"""The equal-compute comparison (bert_jax.experiments.compare): budgets, equal FLOPs, and the whole experiment on
the `test` budget (bundled corpus, GLUE samples), rerun in part to check that the same seed gives the same table."""
import json
import pathlib
import shutil

import jax
import pytest
from train_helpers import XLA_CACHE_DIR

from bert_jax import config_lib, flops, storage
from bert_jax.experiments import compare
from bert_jax.tasks import glue

COMPARED = ("bert", "roberta", "albert", "electra", "modernbert")  # those with a learning rate in configs/compare.py

DATA = pathlib.Path(__file__).parents[1] / "data"

EXPECTED = {  # family: (objective, masking mode, example kind, layer groups of 4 layers, embedding width)
    "bert": ("mlm_nsp", "static", "nsp_pairs", 4, 128),
    "roberta": ("mlm", "dynamic", "full_sentences", 4, 128),
    "albert": ("mlm_sop", "dynamic", "sop_pairs", 1, 64),
    "electra": ("rtd", "dynamic", "doc_sentences", 4, 64),
    "modernbert": ("mlm", "dynamic", "packed_documents", 4, 128),
}


@pytest.mark.parametrize("points,grid", [((0.5, 1.0), 2), ((0.25, 0.5, 1.0), 4), ((1 / 3, 1.0), 3), ((1.0,), 1)])
def test_checkpoint_grid_lands_on_every_point(points, grid):
    assert compare.checkpoint_grid(points) == grid
    assert compare.checkpoint_steps(12 * grid, points) == [round(p * 12 * grid) for p in points]


def test_every_family_gets_the_same_flops_in_its_own_recipe():
    budget = config_lib.load_preset("compare", "cpu-small")
    for family, (objective, masking, kind, groups, embedding) in EXPECTED.items():
        config = compare.pretraining_config(family, budget, "prepared", seed=0)
        assert (config.objective, config.masking.mode, config.data.example_kind) == (objective, masking, kind)
        assert (config.model.num_hidden_groups, config.model.embedding_size) == (groups, embedding)
        assert config.model.hidden_size == 128 and config.model.num_hidden_layers == 4
        step = flops.train_step_flops(config)
        # Steps are rounded down to the checkpoint grid (2 for points 1/2 and 1): within two steps of the budget.
        assert budget.pretrain_flops - 2 * step < config.total_steps * step <= budget.pretrain_flops
        assert config.total_steps % config.checkpoint_every_steps == 0 and config.keep_checkpoints == 2
    electra = compare.pretraining_config("electra", budget, "prepared", seed=0).model.generator
    assert (electra.hidden_size, electra.intermediate_size, electra.num_hidden_layers) == (32, 128, 4)


def test_unknown_budget_and_missing_glue_are_named(tmp_path):
    with pytest.raises(config_lib.ConfigError, match="cpu-small"):
        config_lib.load_preset("compare", "cpu-huge")
    with pytest.raises(glue.GlueDataError, match="RTE"):
        compare.run("test", tmp_path / "work", "data/corpus/*.txt", tmp_path / "no-glue", tmp_path / "results")


def test_stages_read_and_write_their_files_in_a_bucket(bucket_dir):
    """The path functions of compare with gs:// folders (the experiment itself runs locally, below)."""
    work = storage.as_path(bucket_dir) / "experiment"
    # Finished stages are read back from the bucket, not redone (config None: nothing may run).
    run_dir = work / "finetune" / "bert" / "4" / "rte" / "seed0"
    (run_dir / "results.json").write_text(json.dumps({"dev_accuracy": 0.5}))
    (run_dir / "seconds.json").write_text("12.5")
    assert compare.run_finetune(None, run_dir) == ({"dev_accuracy": 0.5}, 12.5)
    (work / "pretrain" / "bert" / "summary.json").write_text(json.dumps({"total_steps": 4}))
    assert compare.pretrain(None, work / "pretrain" / "bert") == {"total_steps": 4}
    (work / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n\n{"step": 2, "loss": 1.0}\n')
    assert compare.read_jsonl(work / "metrics.jsonl") == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}]
    prepared = compare.prepared_dir(work, "wordpiece", pathlib.Path("vocab.txt"))
    assert str(prepared) == f"{bucket_dir}/experiment/corpus/wordpiece-vocab.txt"
    for i in range(2):
        (prepared / f"{i:05d}.done.json").write_text(json.dumps({"documents": 3, "tokens": 100}))
    assert compare.corpus_summary({"bert": str(prepared)}) == "6 documents, 200 tokens as wordpiece-vocab.txt"
    budget = config_lib.load_preset("compare", "test")
    config = compare.finetune_config("rte", work / "init", 0, budget, f"{bucket_dir}/glue")
    assert (config.init, config.data_dir) == (f"{bucket_dir}/experiment/init", f"{bucket_dir}/glue/RTE")

    from matplotlib import pyplot as plt
    fig = plt.figure()
    compare.save_png(fig, work / "plot.png")
    plt.close(fig)
    assert (work / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A bucket --glue lacking a task is named; an unusable --results_dir fails before any training.
    stsb = DATA / "glue" / "STS-B" / "train.tsv"
    (storage.as_path(bucket_dir) / "glue" / "STS-B" / "train.tsv").write_bytes(stsb.read_bytes())
    with pytest.raises(glue.GlueDataError, match=r"/glue lacks RTE \(neither GLUE TSV folders"):
        compare.run("test", work, "unused", f"{bucket_dir}/glue", f"{bucket_dir}/results")
    with pytest.raises(storage.StorageError, match="gs://no-such-bucket does not exist"):
        compare.run("test", work, "unused", DATA / "glue", "gs://no-such-bucket/results")


@pytest.fixture
def suite_compilation_cache(monkeypatch):
    """compare.run points JAX's persistent cache at WORKDIR/xla_cache (here a fresh tmp_path, so nothing carries over
    to the next test run) and caches only compiles of a second or more. Keep the suite's cache instead, and cache
    every compile: the experiment compiles some 300 programs under a second (per-shard slices of each checkpoint save,
    initialisers...), which a later run, and the BERT rerun below, then load instead of compiling."""
    previous = jax.config.jax_persistent_cache_min_compile_time_secs

    def enable(directory):
        del directory
        jax.config.update("jax_compilation_cache_dir", XLA_CACHE_DIR)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

    monkeypatch.setattr(compare.train_lib, "enable_compilation_cache", enable)
    yield
    jax.config.update("jax_persistent_cache_min_compile_time_secs", previous)


def test_whole_experiment_writes_the_table_and_plots_and_repeats_exactly(tmp_path, suite_compilation_cache,
                                                                          one_device_mesh):
    work, results = tmp_path / "work", tmp_path / "results"
    # The two smaller books of the bundled corpus (each is one document; BERT's sentence pairs need two): every stage
    # runs the same code on 56% of the text to tokenize and pack.
    corpus = "data/corpus/chesterton-brown.txt,data/corpus/austen-persuasion.txt"
    run = lambda: compare.run("test", work, corpus, DATA / "glue", results, seed=0)
    report = run()
    budget = report["budget"]
    assert set(report["rows"]) == {*COMPARED, compare.BASELINE}
    for family in COMPARED:
        pre = report["rows"][family]["pretraining"]
        assert budget["pretrain_flops"] - 2 * pre["flops_per_step"] < pre["pretrain_flops"] <= budget["pretrain_flops"]
        assert pre["tokens_seen"] == pre["total_steps"] * budget["batch_size"] * budget["seq_length"]
        points = report["rows"][family]["points"]
        assert [p["step"] for p in points] == [pre["total_steps"]]  # the test budget's one glue point
        for point in points:
            assert set(point["runs"]) == {"rte"}
            for task, runs in point["runs"].items():
                assert len(runs) == 1 and -100 <= compare.task_score(task, runs[0]) <= 100
    assert report["rows"][compare.BASELINE]["points"][0]["flops"] == 0
    table = (results / "compare.md").read_text()
    recipes = [compare.recipe(name) for name in (*COMPARED, compare.BASELINE)]
    for name in [*recipes, "Table 2.1", "albert | xxlarge", "ELECTRA against BERT"]:
        assert name in table
    assert ("Reproduced: " in table) != ("Not reproduced: " in table)
    for png in ("pretraining_loss.png", "glue_vs_flops.png"):
        assert (results / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    as_json = lambda tree: json.loads(json.dumps(tree))
    assert json.loads((results / "compare.json").read_text())["rows"] == as_json(report["rows"])

    # The same seed gives the same numbers: redo BERT's pretraining and fine-tunes from nothing.
    shutil.rmtree(work / "pretrain" / "bert")
    shutil.rmtree(work / "finetune" / "bert")
    again = run()
    for key in ("loss_curve", "total_steps", "pretrain_flops"):
        assert as_json(again["rows"]["bert"]["pretraining"][key]) == as_json(report["rows"]["bert"]["pretraining"][key])
    assert [p["runs"] for p in again["rows"]["bert"]["points"]] == [p["runs"] for p in report["rows"]["bert"]["points"]]
