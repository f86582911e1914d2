"""The parameter table reproduces the papers' counts, and its JSON agrees with the printed table."""
import json
import subprocess
import sys

import pytest
import torch
import transformers

from bert_jax import config_lib, param_table, state_dict


@pytest.fixture(scope="module")
def rows():
    return param_table.rows()


def test_counts_match_the_papers_or_carry_a_note(rows):
    compared = [r for r in rows if r["paper_params"]]
    assert len(compared) == 13
    for row in compared:
        assert abs(row["vs_paper"]) <= param_table.TOLERANCE or row["note"], row


def test_counts_equal_the_reference_implementation(rows):
    """Every preset has exactly as many parameters as transformers' backbone (BertModel, ..., ModernBertModel) of
    the config.json the export writes (no allocation)."""
    for row in rows:
        model = config_lib.load_preset(row["family"], row["size"]).model
        hf = state_dict.config_to_hf(model, "backbone")
        with torch.device("meta"):
            reference = getattr(transformers, hf["architectures"][0])(transformers.AutoConfig.for_model(**hf))
        assert row["params"] == sum(p.numel() for p in reference.parameters()), row


def test_albert_embedding_arithmetic():
    block = param_table.albert_embedding_block()
    assert block["untied"] == 23_040_000
    assert block["factorized"] == 3_938_304


def test_cli_json_agrees_with_printed_table():
    run = lambda *args: subprocess.run([sys.executable, "-m", "bert_jax.param_table", *args], check=True,
                                       capture_output=True, text=True).stdout
    table = json.loads(run("--json"))
    printed = run()
    assert {"family", "size", "params", "paper_params", "seed_params"} <= set(table[0])
    for row in table:
        assert f"| {row['family']} | {row['size']} |" in printed
        assert f"{row['params'] / 1e6:.1f}M" in printed
    assert "23,040,000" in printed and "3,938,304" in printed
