"""The family registry: one file per family, the only code that knows family names; modeling stays light."""
import ast
import importlib.util
import pathlib
import subprocess
import sys

import pytest

from bert_jax import config_lib, families

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bert_jax"


def test_every_family_file_registers_itself_under_its_name():
    assert families.names()[:4] == ("bert", "roberta", "albert", "electra")  # oldest paper first
    for name in families.names():
        family = families.get(name)
        assert family.name == name and (PACKAGE / "families" / f"{name}.py").exists()
        assert family.default_size in family.sizes and "tiny" in family.sizes
        assert set(family.paper_params_millions) <= set(family.sizes)
    with pytest.raises(families.UnknownFamilyError, match="unknown model family 'gpt'.*bert_jax/families"):
        families.get("gpt")


@pytest.mark.parametrize("name", families.names())
def test_each_config_file_gives_the_registry_preset(name):
    spec = importlib.util.spec_from_file_location(f"configs_{name}", ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.get_config("tiny").to_dict() == config_lib.load_preset(name, "tiny").to_dict()
    assert module.get_config().model.to_dict() == config_lib.load_preset(name).model.to_dict()


def family_name_comparisons(path: pathlib.Path) -> list[str]:
    """`x == "bert"`, `family in ("albert", "electra")` and the like: code that dispatches on a family name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        constants = [c for o in operands for c in ([o] if isinstance(o, ast.Constant) else
                                                   getattr(o, "elts", []) if isinstance(o, (ast.Tuple, ast.List,
                                                                                          ast.Set)) else [])]
        if any(isinstance(c, ast.Constant) and c.value in families.names() for c in constants):
            found.append(f"{path}:{node.lineno}")
    return found


def test_no_module_outside_families_compares_a_family_name():
    modules = [p for p in [*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
               if "families" not in p.relative_to(ROOT).parts]
    assert len(modules) > 40
    assert [hit for path in modules for hit in family_name_comparisons(path)] == []


def test_the_check_finds_a_comparison(tmp_path):
    source = tmp_path / "dispatch.py"
    source.write_text('def f(model):\n    return model.family == "roberta" or model.family in ("albert", "x")\n')
    assert len(family_name_comparisons(source)) == 2


def test_modeling_and_the_families_import_neither_the_pipeline_nor_the_trainer():
    """Building a model (any family's) must not start TensorFlow or pull in the trainer."""
    code = ("import sys\nfrom bert_jax import families, modeling\n"
            "[families.get(name) for name in families.names()]\n"
            "print(sorted(m for m in sys.modules if m.startswith(('bert_jax.input_pipeline', 'bert_jax.train', "
            "'bert_jax.finetune', 'bert_jax.run_loop', 'tensorflow'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert loaded.stdout.strip() == "[]", loaded.stdout
