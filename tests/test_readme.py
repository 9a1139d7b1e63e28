"""The README stays true: its variant table is the registry, and CI runs its test command."""

import re
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


def _quoted_results() -> dict[str, str]:
    """{comparison directory under results/: the block the README quotes between its RESULTS markers}."""
    found = re.findall(r"<!-- RESULTS:([\w-]+):BEGIN -->\n(.*?)<!-- RESULTS:\1:END -->", README, flags=re.S)
    return dict(found)


def test_readme_results_are_the_shipped_runs():
    """Every comparison table in the README is what `attnlab report` computes from the raw run logs shipped in
    results/<name>/ (summary.json, metrics.jsonl), so no number in it was typed or pasted from elsewhere."""
    from attnlab.experiments.report import read_results, results_tables

    blocks = _quoted_results()
    shipped = sorted(p.name for p in (ROOT / "results").iterdir() if p.is_dir()) if (ROOT / "results").is_dir() else []
    assert sorted(blocks) == shipped
    for name, block in blocks.items():
        results, _ = read_results(ROOT / "results" / name)
        assert block == results_tables(results, heading="####"), name
