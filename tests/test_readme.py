"""The README stays true: its variant table is the registry, and CI runs its test command."""

from pathlib import Path

from attnlab import variant_info, variants

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def test_variant_table_is_the_registry():
    block = README.split("<!-- VARIANTS:BEGIN -->")[1].split("<!-- VARIANTS:END -->")[0].strip().splitlines()
    want = [f"| `{n}` | {_cell(variant_info(n).description)} | {_cell(variant_info(n).source)} |" for n in variants()]
    assert block == want


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest' in README
    for step in ("pip install torch==2.13.0", 'pip install -e ".[test]"', "python -m pytest\n"):
        assert step in ci
