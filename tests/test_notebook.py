"""The example notebook runs top to bottom, so it never rots."""
import pathlib

import nbclient
import nbformat

NOTEBOOK = pathlib.Path(__file__).resolve().parent.parent / "notebooks" / "load_and_embed.ipynb"


def test_load_and_embed_notebook_runs(monkeypatch, tmp_path):
    monkeypatch.delenv("BERT_JAX_CHECKPOINT", raising=False)
    monkeypatch.delenv("BERT_JAX_MLM_CHECKPOINT", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's temporary folder, left empty when it stops
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    printed = "".join(output.get("text", "") for output in outputs)
    assert "bert backbone: 22,713,216 parameters" in printed
    nearest = {line.split("->")[0].strip(): line.split("->")[1] for line in printed.splitlines() if "->" in line}
    assert "Someone strums" in nearest["'A man is playing a guitar.'"]
    assert any("image/png" in output.get("data", {}) for output in outputs)  # the heat map
    assert printed.count("Paris is the capital of [MASK].") == 1
    assert not list(tmp_path.iterdir())  # the random-weight stand-in for a masked LM is removed
