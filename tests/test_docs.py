"""The docs site (docs/, mkdocs.yml) and the README stay true to the code and to the shipped results.

Generated blocks (between ``<!-- NAME:BEGIN -->`` and ``<!-- NAME:END -->``) are rewritten by
``python docs/generate.py``; here each kind is also checked against its source directly: the results tables against
``attnlab report``'s own functions on results/, the variant tables against the registry, the switch tables against
``dataclasses.fields``. The rest checks what ``mkdocs build --strict`` cannot see without mkdocs installed: the nav
covers every page, seed mentions link to the Sources page, the README is short and its headline numbers are
measured ones, and CI runs what the README says.
"""

import dataclasses
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from attnlab import variant_info, variants
from helpers import docs_generate, script

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()


generate = docs_generate()


def _pages() -> dict[str, str]:
    """{path relative to docs/: text} of every Markdown page."""
    return {p.relative_to(DOCS).as_posix(): p.read_text() for p in sorted(DOCS.glob("**/*.md"))}


def _blocks(text: str, name: str) -> list[str]:
    return re.findall(rf"<!-- {re.escape(name)}:BEGIN -->\n(.*?)<!-- {re.escape(name)}:END -->", text, flags=re.S)


def _unlink(text: str) -> str:
    """Markdown links reduced to their text: [the Boneless write-up](sources.md#boneless-attention) -> the Boneless write-up."""
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)


# ------------------------------------------------------------------------------------------------ generated blocks


def test_generated_blocks_are_current():
    """Every generated block on every page equals what `python docs/generate.py` writes now."""
    assert generate.stale() == [], "run `python docs/generate.py`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


@pytest.mark.parametrize("where", ["README.md", "docs/variants.md"])
def test_variant_table_is_the_registry(where):
    blocks = _blocks((ROOT / where).read_text(), "VARIANTS")
    assert len(blocks) == 1, where
    rows = [_unlink(line) for line in blocks[0].strip().splitlines()[2:]]
    want = [f"| `{n}` | {_cell(variant_info(n).description)} | {_cell(variant_info(n).source)} |" for n in variants()]
    assert rows == want


def _switch_rows(block: str) -> list[list[str]]:
    rows = []
    for line in block.strip().splitlines()[2:]:
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        rows.append([c.strip() for c in cells])
    return rows


@pytest.mark.parametrize("class_name", ["AttentionConfig", "MagnitudeConfig", "HeadMixConfig", "ProjectionConfig",
                                        "GPTConfig", "TrainConfig", "DataConfig"])
def test_switch_table_is_the_dataclass(class_name):
    """docs/variants.md lists every field of the config dataclass, in order, with its type and default."""
    cls = generate.config_classes()[class_name]
    blocks = _blocks((DOCS / "variants.md").read_text(), f"SWITCHES:{class_name}")
    assert len(blocks) == 1
    rows = _switch_rows(blocks[0])
    assert [r[0] for r in rows] == [f"`{f.name}`" for f in dataclasses.fields(cls)]
    for row, f in zip(rows, dataclasses.fields(cls)):
        type_ = f.type if isinstance(f.type, str) else f.type.__name__
        assert row[1].strip("`").replace("\\|", "|") == type_, f.name
        value = f.default_factory() if f.default is dataclasses.MISSING else f.default
        default = f'"{value}"' if isinstance(value, str) else repr(value)
        assert row[2] == f"`{default}`", f.name
    docs = generate.field_docs(cls)
    assert [_unlink(r[3]).replace("\\", "") for r in rows] == \
        [" ".join(docs[f.name].split()).replace("\\", "") for f in dataclasses.fields(cls)]


def test_field_docs_are_the_attribute_docstrings(tmp_path, monkeypatch):
    """The switch tables take each field's docstring; a field without one stops the generator, naming it."""
    import textwrap

    source = textwrap.dedent('''
        from dataclasses import dataclass

        @dataclass
        class Demo:
            a: int = 1
            """The a."""
            b: str = "x"
            """The b,
            on two lines."""

        @dataclass
        class Bare:
            a: int = 1
            """The a."""
            c: int = 2  # a comment is not a docstring
    ''')
    path = tmp_path / "field_docs_demo.py"  # a real file: field_docs reads the class's source
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("field_docs_demo", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "field_docs_demo", module)  # @dataclass and inspect look the module up
    spec.loader.exec_module(module)
    assert generate.field_docs(module.Demo) == {"a": "The a.", "b": "The b,\non two lines."}
    with pytest.raises(ValueError, match="Bare.c has no docstring"):
        generate.field_docs(module.Bare)


def test_results_blocks_are_the_shipped_runs():
    """Every results table on the docs pages is what `attnlab report` computes from the raw run logs shipped in
    results/<name>/ (summary.json, metrics.jsonl), so no number in it was typed or pasted from elsewhere; and every
    directory under results/ is quoted on some page (a measurement that is not a comparison, such as
    results/magnitude-lowrank, by its own generated block: LOWRANK-ERROR; the single-seed protocol check
    results/hijack-fixed by HIJACK-PROTOCOL; a sweep directory by SWEEP, a weight-decay sweep by RANK-SWEEP)."""
    from attnlab.experiments.report import read_results, results_tables

    found, other = {}, set()
    for page, text in _pages().items():
        for name, block in re.findall(r"<!-- RESULTS:([\w-]+):BEGIN -->\n(.*?)<!-- RESULTS:\1:END -->", text, re.S):
            found.setdefault(name, []).append((page, block))
        other.update(re.findall(r"<!-- (?:LOWRANK-ERROR|HIJACK-PROTOCOL|SWEEP|RANK-SWEEP):([\w-]+)[:\w-]*:BEGIN -->", text))
        if "<!-- BENCH-GENERATE:BEGIN -->" in text:
            other.add("benchmarks")  # results/benchmarks: saved benchmark runs (BENCH-GENERATE)
    shipped = sorted(p.name for p in (ROOT / "results").iterdir() if p.is_dir())
    assert sorted(set(found) | other) == shipped
    for name, quotes in found.items():
        results, _ = read_results(ROOT / "results" / name)
        for page, block in quotes:
            expected = generate.collapse(results_tables(results, heading="####"), generate.COLLAPSED)  # folded tables
            assert block == expected, f"{page}: RESULTS:{name}"


def test_the_studies_index_names_each_studys_raw_logs():
    """Each row of the studies index names, in its raw-logs column, every results/ directory that the row's pages
    show in a generated block, and only directories that exist."""
    block = re.compile(r"<!-- (?:RESULTS|LOWRANK-ERROR|HIJACK-PROTOCOL|SWEEP|RANK-SWEEP):([\w-]+)[:\w-]*:BEGIN -->")
    table = (DOCS / "studies" / "index.md").read_text().split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| [")]
    assert len(rows) >= 8
    for row in rows:
        study, *_, logs = row.strip("| ").split(" | ")
        pages = re.findall(r"\]\(([\w-]+\.md)\)", study)
        shown = {name for page in pages for name in block.findall((DOCS / "studies" / page).read_text())}
        listed = set(re.findall(r"`results/([\w-]+)/`", logs))
        assert shown <= listed, (pages[0], sorted(shown - listed))
        assert all((ROOT / "results" / name).is_dir() for name in listed), (pages[0], listed)


def test_images_exist():
    """Every image on a page is a file (the plots: results/**/*.png, which docs/hooks.py publishes under results/)."""
    for page, text in {**_pages(), "../README.md": README}.items():
        base = (DOCS / page).parent
        text = re.sub(r"`[^`\n]*`", "", re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.M | re.S))  # not code
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text):
            if "://" in target:
                continue
            path = (base / target).resolve()
            if path.is_relative_to(DOCS) and path.relative_to(DOCS).parts[0] == "results":
                path = ROOT / path.relative_to(DOCS)  # docs/hooks.py publishes results/ at the site's root
            assert path.is_file(), f"{page}: {target}"


def test_docs_hook_publishes_the_plots():
    """docs/hooks.py adds every results/**/*.png to the site under its own path (needs the docs extra)."""
    pytest.importorskip("mkdocs")
    from mkdocs.config import load_config
    from mkdocs.structure.files import Files

    hooks = script("docs/hooks.py", "docs_hooks")
    files = hooks.on_files(Files([]), load_config(str(ROOT / "mkdocs.yml")))
    pngs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "results").glob("**/*.png")}
    assert pngs and {f.src_uri for f in files} == pngs
    assert all(Path(f.abs_src_path) == ROOT / f.src_uri for f in files)


# ------------------------------------------------------------------------------------------------ site structure


def _nav_pages() -> list[str]:
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config.split("\nnav:\n")[1]
    nav = re.split(r"\n(?=\S)", nav)[0]  # up to the next top-level key
    return re.findall(r"([\w./-]+\.md)\s*$", nav, flags=re.M)


def test_every_page_is_in_the_nav():
    nav = _nav_pages()
    assert len(nav) == len(set(nav))
    assert sorted(nav) == sorted(_pages()), "every docs page in mkdocs.yml's nav, and every nav entry a page"
    for page in ("index.md", "getting-started.md", "variants.md", "magnitude.md", "claims.md", "studies/index.md",
                 "speed.md", "testing.md", "contributing.md", "api.md", "sources.md"):
        assert page in nav


def test_seed_mentions_link_to_sources():
    """The seed write-ups are defined once, on the Sources page: a page that mentions one links it there."""
    for page, text in {**_pages(), "../README.md": README}.items():
        if page == "sources.md":
            continue
        to_docs = "docs/" if page == "../README.md" else "../" * page.count("/")
        for mention in re.findall(r"\b[Ss]eeds? (\d{3}(?:(?:, | and | to |-)\d{3})*)\b", text):
            for number in re.findall(r"\d{3}", mention):
                if page == "../README.md":
                    assert f"{to_docs}sources.md" in text, page  # GitHub ignores the anchors' attr_list ids
                else:
                    assert f"{to_docs}sources.md#seed-{number}" in text, f"{page}: seed {number}"


# ------------------------------------------------------------------------------------------------ README


def test_readme_is_short_and_names_the_docs():
    assert len(README.splitlines()) <= 120  # a five-minute read
    assert 'pip install -e ".[docs]"' in README and "mkdocs serve" in README
    for link in re.findall(r"\]\((docs/[^)#\s]+)", README):
        assert (ROOT / link).is_file(), link


def _study_lines() -> list[str]:
    section = README.split("\n## Studies\n")[1].split("\n## ")[0]
    return [item for item in re.split(r"\n(?=- )", section) if item.startswith("- ")]


NUMBER = re.compile(r"(?<![\w.,])(?:\d+\.\d{3,}|\d{1,3}(?:,\d{3})+)(?![\w.,]\d)")
ONE_DECIMAL = re.compile(r"(?<![\w.,])\d+\.\d(?![\w.,]?\d)")  # the hijack tables' accuracies, e.g. 12.4
PERCENT = re.compile(r"(?<![\w.,])\d+\.\d\d(?=%)")  # the accuracy tables' percentages, e.g. 96.58%


def test_readme_headlines_are_measured():
    """Each study's headline in the README links its page, and every number in it with 3 or more decimals (or a
    thousands separator; or one decimal, or a percentage with two, on a line that names results/ directories) is printed by `attnlab report`
    for the results/ directories the line names, or, for a study without raw logs, stands on the page it links."""
    from attnlab.experiments.report import read_results, results_tables

    linked = set()
    for line in _study_lines():
        pages = re.findall(r"\]\(docs/([^)#\s]+\.md)", line)
        linked.update(pages)
        dirs = re.findall(r"`results/([\w-]+)`", line)
        if dirs:
            source = "".join(results_tables(read_results(ROOT / "results" / d)[0], heading="####") for d in dirs)
        else:
            source = "".join((DOCS / p).read_text() for p in pages)
        numbers = NUMBER.findall(line) + (ONE_DECIMAL.findall(line) + PERCENT.findall(line) if dirs else [])
        if dirs:
            assert numbers, line
        for number in numbers:
            assert number in source, f"{number} is not in {dirs or pages}: {line}"
    studies = {f"studies/{p.name}" for p in (DOCS / "studies").glob("*.md") if p.name != "index.md"}
    assert studies <= linked, "every study page has a headline in the README"


def test_ci_runs_the_readme_test_command_and_builds_the_docs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest' in README
    for step in ("pip install torch==2.13.0", 'pip install -e ".[test]"', "python -m pytest\n",
                 'pip install -e ".[docs]"', "mkdocs build --strict"):
        assert step in ci
    assert "docs = [" in (ROOT / "pyproject.toml").read_text()


def test_magnitude_long_trained_key_claims_are_the_results():
    """docs/studies/magnitude-long.md's prose on the trained keys quotes results/magnitude-lowrank: each number
    is recomputed here from error_trained.json and the runs' summaries (rounded as the page rounds it)."""
    import json

    page = (ROOT / "docs" / "studies" / "magnitude-long.md").read_text()
    results = ROOT / "results" / "magnitude-lowrank"
    rows = json.loads((results / "error_trained.json").read_text())

    def row(run, landmarks, r, eps):
        (hit,) = [x for x in rows if x["run"] == run and x["landmarks"] == landmarks and x["rank"] == r
                  and x["eps"] == eps]
        return hit

    def med(run, landmarks, r, eps, key="w", digits=2):
        return f"{row(run, landmarks, r, eps)[key]['median']:.{digits}f}"

    def span(values, digits=2):
        texts = sorted({f"{v:.{digits}f}" for v in values}, key=float)
        return f"{texts[0]}-{texts[-1]}" if len(texts) > 1 else texts[0]

    runs = ("keys-exact", "keys-lowrank")
    losses = [json.loads((results / r / "summary.json").read_text())["final_val_loss"] for r in runs]
    claims = [
        f"validation loss {losses[0]:.2f} and {losses[1]:.2f}",
        f"learned t ({span([t for x in rows if x['rank'] == 16 and x['eps'] == 1e-3 and x['landmarks'] == 'init' for t in x['t']])})",
        f"(median {med('keys-exact', 'init', 32, 1e-3, 'w_exact')}, max {row('keys-exact', 'init', 32, 1e-3)['w_exact']['max']:.1f})",
        f"median {med('keys-exact', 'init', 32, 1e-3)} at r = 32 with the initial landmarks, "
        f"{med('keys-exact', 'sampled', 32, 1e-3)} with sampled ones",
        f"still {med('keys-exact', 'sampled', 128, 1e-3)} at r = 128",
        f"error of {med('keys-lowrank', 'trained', 32, 1e-3)} at eps = 1e-3",
        f"initial N(0, 0.5^2) draw ({med('keys-lowrank', 'init', 32, 1e-3)})",
        f"falls to {span([float(med(r, 'sampled', 32, 0.1, digits=3)) for r in runs], 3)} (weights of median "
        f"{span([float(med(r, 'sampled', 32, 0.1, 'w_exact')) for r in runs])})",
        f"to {span([float(med(r, 'sampled', 64, 0.1, digits=3)) for r in runs], 3)} at r = 64",
        f"stays at {span([float(med(r, 'init', 32, 0.1)) for r in runs])}",
    ]
    flat = " ".join(page.split())
    for claim in claims:
        assert claim in flat, claim


def test_magnitude_long_training_prose_is_the_results():
    """docs/studies/magnitude-long.md's prose on the T = 1024 comparison: the loss curve points and the speed ratios
    are recomputed from results/magnitude-long (metrics.jsonl and the summaries)."""
    import json

    from attnlab.rundir import read_metrics

    page = " ".join((ROOT / "docs" / "studies" / "magnitude-long.md").read_text().split())
    results = ROOT / "results" / "magnitude-long"
    evals = {r["step"]: r["val_loss"] for r in read_metrics(results / "standard" / "seed0") if r["val_loss"] is not None}
    assert f"from {evals[100]:.4f} at step 100 to {evals[500]:.4f} at step 500" in page
    finals = [json.loads(f.read_text())["final_val_loss"] for f in results.glob("*/seed*/summary.json")]
    assert len(finals) == 9 and f"between {min(finals):.4f} and {max(finals):.4f}" in page

    def speed(variant):
        runs = [json.loads(f.read_text())["tokens_per_s"] for f in (results / variant).glob("seed*/summary.json")]
        return sum(runs) / len(runs)

    low, exact, std = speed("magnitude-causal-lowrank"), speed("magnitude-causal"), speed("standard")
    assert f"at {low / exact:.1f}x the exact form's speed" in page and f"so {low / std:.2f}x of it" in page


def test_the_train_step_numbers_on_the_speed_page_are_the_saved_benchmark():
    import json

    bench = json.loads((ROOT / "results" / "benchmarks" / "train_step.json").read_text())
    text = (ROOT / "docs" / "speed.md").read_text()
    for number in (f"{bench['median_step_ms']['attnlab']:.1f} ms", f"{bench['median_step_ms']['reference']:.1f} ms",
                   f"ratio of {bench['ratio']}", f"equal, {bench['step0_loss']['attnlab']}", f"{bench['steps_each']} steps"):
        assert number in text, number
    assert bench["step0_loss"]["attnlab"] == bench["step0_loss"]["reference"]


def test_the_head_at_answers_numbers_on_the_speed_page_are_the_saved_benchmark():
    import json

    bench = json.loads((ROOT / "results" / "benchmarks" / "head_at_answers.json").read_text())
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    ms = bench["median_step_ms"]
    for phrase in (f"{ms['every_position']:.1f} ms a step with the head at every position",
                   f"against {ms['answers_only']:.1f} ms at the answers, a ratio of {bench['ratio']}",
                   f"({bench['steps_each']} steps each", f"(batch {bench['batch_size']}, T = {bench['seq_len']}, a vocabulary of 8,192)"):
        assert phrase in text, phrase
    assert bench["vocab_size"] == 8192 and bench["experiment"] == "zoology-fig2-t64-d64"
    assert bench["ratio"] == round(ms["answers_only"] / ms["every_position"], 3)


def test_magnitude_long_2_prose_is_the_results():
    """docs/studies/magnitude-long.md's prose on the GPU comparison (magnitude-long-2) is recomputed from its
    results/ folder: run times, the low-rank gap during training, the seeds' spreads, standard's curve."""
    import json
    import statistics

    from attnlab.rundir import read_metrics

    page = " ".join((ROOT / "docs" / "studies" / "magnitude-long.md").read_text().split())
    results = ROOT / "results" / "magnitude-long-2"

    def runs(variant):
        return [json.loads(f.read_text()) for f in sorted((results / variant).glob("seed*/summary.json"))]

    def span(values, fmt):
        return f"{min(values):{fmt}}-{max(values):{fmt}}"

    for variant, unit in (("standard", "s"), ("magnitude-causal-lowrank", "s"), ("magnitude-causal", "s")):
        assert f"{span([r['wall_time_s'] for r in runs(variant)], '.0f')} {unit}" in page, variant
    finals = [r["final_val_loss"] for r in runs("magnitude-causal")]
    assert f"({min(finals):.4f} to {max(finals):.4f})" in page
    low = [r["final_val_loss"] for r in runs("magnitude-causal-lowrank")]
    assert f"within {max(low) - min(low):.4f} of each other" in page

    def mean_eval(variant, step):
        return statistics.mean(next(m["val_loss"] for m in read_metrics(d) if m["step"] == step)
                               for d in sorted((results / variant).glob("seed*")))

    gaps = [mean_eval("magnitude-causal-lowrank", s) - mean_eval("standard", s) for s in (600, 1000)]
    assert f"+{gaps[0]:.4f} at step 600 and +{gaps[1]:.4f} at step 1000" in page
    evals = {m["step"]: m["val_loss"] for m in read_metrics(results / "standard" / "seed0") if m["val_loss"] is not None}
    assert f"from {evals[200]:.4f} at step 200 to {evals[1200]:.4f} at step 1200" in page


def test_the_gpu_block_sweep_prose_is_the_saved_benchmark():
    """docs/speed.md's and magnitude-long.md's prose on the block form on the GPU: the ratios and memory shares of
    blocks of 256 against 64 and against the explicit path, recomputed from results/benchmarks/cuda."""
    import json

    cuda = ROOT / "results" / "benchmarks" / "cuda"
    rows = json.loads((cuda / "magnitude_chunks.json").read_text())["results"]
    at = {(r["row"], r["seq"], r.get("chunk")): r for r in rows}
    seqs = (1024, 2048, 4096)
    speedup = [at["lowrank-prefix", t, 64]["fwd_bwd_ms"] / at["lowrank-prefix", t, 256]["fwd_bwd_ms"] for t in seqs]
    vs_explicit = [at["lowrank-prefix", t, 256]["fwd_bwd_ms"] / at["lowrank-prefix-explicit", t, None]["fwd_bwd_ms"]
                   for t in seqs]
    memory = [at["lowrank-prefix", t, 256]["peak_mb"] / at["lowrank-prefix-explicit", t, None]["peak_mb"] for t in seqs]
    speed = " ".join((DOCS / "speed.md").read_text().split())
    study = " ".join((DOCS / "studies" / "magnitude-long.md").read_text().split())
    ratios = " / ".join(f"{x:.2f}x" for x in vs_explicit)
    assert " / ".join(f"{x:.1f}x" for x in speedup) + " against 64" in speed
    assert f"to {ratios} the explicit path's time at " + " / ".join(f"{100 * m:.0f}%" for m in memory) in speed
    assert ", ".join(f"{x:.2f}x" for x in vs_explicit[:2]) + f" and {vs_explicit[2]:.2f}x the explicit path" in study
    assert ", ".join(f"{100 * m:.0f}%" for m in memory[:2]) + f" and {100 * memory[2]:.0f}% of its memory" in study
    assert (f"slower of the two by {at['lowrank-prefix', 1024, 64]['fwd_bwd_ms'] / at['lowrank-prefix-explicit', 1024, None]['fwd_bwd_ms']:.1f}x"
            " at T = 1024") in speed
    long = {(r["row"], r["seq"]): r for r in json.loads((cuda / "magnitude_long.json").read_text())["results"]}
    assert all(long["lowrank-prefix", t]["block"] == 256 for t in (1024, 2048))  # measured with prefix_block's default minimum
    blocks = [long["lowrank-prefix", t] for t in (1024, 2048)]
    explicit = [long["lowrank-prefix-explicit", t] for t in (1024, 2048)]
    assert ("The blocks cost " + " / ".join(f"{b['fwd_bwd_ms'] / e['fwd_bwd_ms']:.2f}x" for b, e in zip(blocks, explicit))
            + " its time at T = 1024 / 2048 with "
            + " / ".join(f"{100 * b['peak_mb'] / e['peak_mb']:.0f}%" for b, e in zip(blocks, explicit))) in speed
    causal = [long["lowrank-causal", t] for t in (1024, 2048, 4096)]
    exact = [long["magnitude-causal", t] for t in (1024, 2048, 4096)]
    assert f"({causal[2]['fwd_bwd_ratio']:.1f}x at T = 4096)" in speed and f"({exact[2]['fwd_bwd_ratio']:.0f}x at 4096)" in speed
    assert (", ".join(f"{r['fwd_bwd_ratio']:.1f}x" for r in causal[:2]) + f" and {causal[2]['fwd_bwd_ratio']:.1f}x "
            "(T = 1024, 2048, 4096)") in study
    assert ", ".join(f"{r['fwd_bwd_ratio']:.0f}x" for r in exact[:2]) + f" and {exact[2]['fwd_bwd_ratio']:.0f}x" in study
    before = {(r["row"], r["seq"]): r for r in json.loads((cuda / "magnitude_long_blocks64.json").read_text())["results"]}
    assert f"the same row gave {before['lowrank-causal', 2048]['fwd_bwd_ratio']:.1f}x at T = 2048" in speed


def test_the_kernel_prose_on_the_speed_page_is_the_saved_benchmark():
    """docs/speed.md's sentences on the Triton kernels on a GPU, recomputed from results/benchmarks/cuda/kernels.json
    and kernels_lowrank.json (ratios to SDPA flash in the same run, memory, route against route)."""
    import json

    cuda = ROOT / "results" / "benchmarks" / "cuda"
    per = {r["T"]: r["routes"] for r in json.loads((cuda / "kernels.json").read_text())["rows"]}
    low = {r["T"]: r["routes"] for r in json.loads((cuda / "kernels_lowrank.json").read_text())["lowrank"]}
    speed = " ".join((DOCS / "speed.md").read_text().split())
    mask = [per[t]["sdpa_float_mask"] for t in (4096, 8192)]
    assert (f"{per[4096]['kernel']['ratio']:.2f}x SDPA flash at T = 4096 and {per[8192]['kernel']['ratio']:.2f}x at "
            "T = 8192 with the prior, in less memory than flash's own call") in speed
    assert all(per[t]["kernel"]["peak_mib"] < per[t]["sdpa_flash"]["peak_mib"] for t in per)
    assert (f"float mask costs {mask[0]['ratio']:.2f}x and {mask[1]['ratio']:.2f}x and takes "
            f"{mask[0]['peak_mib']:,.0f} and {mask[1]['peak_mib']:,.0f} MiB") in speed
    assert (f"Without a prior the kernel is as fast as flash at T = 4096 and 8192 "
            f"({per[4096]['kernel_no_prior']['ratio']:.2f}x and {per[8192]['kernel_no_prior']['ratio']:.2f}x)") in speed
    assert all(abs(per[t]["kernel_no_prior"]["ratio"] - 1) < 0.05 for t in (4096, 8192))
    assert f"at T = 1024 it costs {per[1024]['kernel_no_prior']['ratio']:.2f}x (three kernel launches" in speed
    assert (f"prior costs {per[1024]['flex']['ratio']:.2f}x, {per[4096]['flex']['ratio']:.2f}x and "
            f"{per[8192]['flex']['ratio']:.2f}x (one compiled kernel per length), more than the kernel at every "
            "length") in speed
    assert all(per[t]["kernel"]["ms"] < per[t]["flex"]["ms"] for t in per)  # why auto picks the kernel
    bench = json.loads((cuda / "kernels_lowrank.json").read_text())
    assert bench["kernel_backward_blocks"] == [64, 32]  # lowrank.CUDA_BACKWARD_BLOCKS: "kernel" is the default
    before = {r["T"]: r["routes"] for r in json.loads((cuda / "kernels_lowrank_log_prior.json").read_text())["lowrank"]}
    seqs = (1024, 4096, 8192)
    assert (f"It costs {low[1024]['kernel']['ratio']:.2f}x, {low[4096]['kernel']['ratio']:.2f}x and "
            f"{low[8192]['kernel']['ratio']:.2f}x SDPA flash at T = 1024, 4096 and 8192 (target 1.5x at T = 4096)") in speed
    assert (f"on the same (64, 32) backward tiles, cost {before[1024]['kernel_bwd_64x32']['ratio']:.2f}x, "
            f"{before[4096]['kernel_bwd_64x32']['ratio']:.2f}x and {before[8192]['kernel_bwd_64x32']['ratio']:.2f}x") in speed
    assert (f"kernels_lowrank_log_prior.json`; {before[4096]['kernel_bwd_64x32']['ms']:.2f} against {low[4096]['kernel']['ms']:.2f} ms at T = 4096, "
            f"with SDPA flash at {before[4096]['sdpa_flash']['ms']:.2f} and {low[4096]['sdpa_flash']['ms']:.2f} ms") in speed
    cut = [1 - low[t]["kernel"]["ratio"] / before[t]["kernel_bwd_64x32"]["ratio"] for t in (4096, 8192)]
    assert "took about a third off at T = 4096 and 8192" in speed and all(0.3 < x < 0.4 for x in cut)
    ms = {route: low[4096][route]["ms"] for route in ("kernel", "sdpa_float_mask", "prefix_blocks", "gate_kernel")}
    assert (f"at T = 4096 {ms['sdpa_float_mask'] / ms['kernel']:.1f}x faster than the dense float mask (which takes "
            f"{low[4096]['sdpa_float_mask']['peak_mib']:,.0f} MiB there and runs out of memory at 8192) and "
            f"{ms['prefix_blocks'] / ms['kernel']:.1f}x faster than the PyTorch block path") in speed
    assert "OutOfMemoryError" in low[8192]["sdpa_float_mask"]["error"]
    ieee = low[4096]["kernel_ieee_factors"]["ratio"]
    assert f"it costs {ieee:.2f}x at T = 4096, about twice the default" in speed
    assert 1.8 < ieee / low[4096]["kernel"]["ratio"] < 2.2
    assert (f"The value-gate kernel costs {low[4096]['gate_kernel']['ratio']:.2f}x at T = 4096, "
            f"{ms['gate_kernel'] / ms['kernel']:.2f}x the prior's kernel") in speed
    # the backward tiles: the default (64, 32) the fastest at every length, 8 warps slower
    tiles = [r for r in low[4096] if r.startswith("kernel_bwd_")]
    assert all(low[t]["kernel"]["ms"] < low[t][r]["ms"] for t in seqs for r in tiles)
    assert (f"(64, 32), the default on CUDA, is the fastest: {low[4096]['kernel']['ratio']:.2f}x SDPA flash at "
            f"T = 4096 against {low[4096]['kernel_bwd_64x64']['ratio']:.2f}x at 64 x 64, though it spills where "
            f"(64, 16) does not ({low[4096]['kernel_bwd_64x16']['ratio']:.2f}x); owning 128 rows is slower "
            f"({low[4096]['kernel_bwd_128x16']['ratio']:.2f}x at (128, 16))") in speed
    assert (f"ranked the tiles the same way ({before[4096]['kernel_bwd_64x32']['ratio']:.2f}x at (64, 32) against "
            f"{before[4096]['kernel']['ratio']:.2f}x at 64 x 64)") in speed
    assert f"yet it is slower: {low[4096]['kernel_bwd_w8']['ratio']:.2f}x at T = 4096" in speed
    assert (f"the kernel went from {before[4096]['kernel_bwd_64x32']['ratio']:.2f}x to "
            f"{low[4096]['kernel']['ratio']:.2f}x SDPA flash at T = 4096 at these tiles") in speed
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (f"bring a per-key log-prior to {per[4096]['kernel']['ratio']:.2f}x SDPA flash on an H100 (forward+backward, "
            f"T = 4096; SDPA with a float mask: {mask[0]['ratio']:.2f}x), the low-rank prefix prior to "
            f"{low[4096]['kernel']['ratio']:.2f}x (from {before[4096]['kernel_bwd_64x32']['ratio']:.2f}x before its "
            "kernels took one exponential per score), short of its 1.5x target") in readme


def test_the_profile_prose_is_the_saved_ncu_report():
    """docs/speed.md's sentences on the Nsight Compute profile of the low-rank kernels, from the saved ncu output."""
    cuda = ROOT / "results" / "benchmarks" / "cuda"
    metrics = {}
    for name in ("ncu_lowrank_forward.txt", "ncu_lowrank_backward.txt"):
        kernel = None
        for line in (cuda / name).read_text().splitlines():
            if m := re.match(r"  (_\w+_kernel) \(", line):
                kernel = m.group(1)
            elif kernel and (m := re.match(r"    (\S.*?\S)\s{2,}(\S+/\S+|%|ms|us|\S*)?\s+([\d,.]+)$", line)):
                metrics.setdefault(kernel, {}).setdefault(m.group(1), m.group(3))
    fwd, dkdv, dq = metrics["_forward_kernel"], metrics["_dkdv_kernel"], metrics["_dq_kernel"]
    speed = " ".join((DOCS / "speed.md").read_text().split())
    assert (f"the dK/dV kernel took {dkdv['Duration']} ms and the dq kernel {dq['Duration']} ms against the "
            f"forward's {fwd['Duration']} ms") in speed
    assert (f"Both backward kernels use {dkdv['Registers Per Thread']} registers per thread and spill: "
            f"{dkdv['Local Memory Spilling Requests']} local-memory spill requests in the dK/dV kernel, "
            f"{dq['Local Memory Spilling Requests']} in the dq kernel") in speed
    assert dq["Registers Per Thread"] == "255"
    occupancy = [float(x["Achieved Occupancy"]) for x in (dkdv, dq)]
    assert f"their achieved occupancy is {occupancy[0]:.1f}%" in speed and abs(occupancy[0] - occupancy[1]) < 0.1
    compute = [float(x["Compute (SM) Throughput"]) for x in (dkdv, dq, fwd)]
    assert f"compute (SM) throughput {compute[0]:.0f}%" in speed and round(compute[1]) == round(compute[0])
    assert (f"The forward uses {fwd['Registers Per Thread']} registers, does not spill, and reaches "
            f"{float(fwd['Achieved Occupancy']):.1f}% occupancy and {compute[2]:.0f}% compute throughput") in speed
    assert fwd["Local Memory Spilling Requests"] == "0"


def test_the_whole_magnitude_layer_prose_is_the_saved_benchmark():
    """docs/speed.md's sentences on the whole low-rank magnitude layers at T = 4096 on a GPU: the ratios against the
    raw-SDPA layer now and in the earlier call, and what each layer's GPU-kernel profile (--profile 15) says."""
    import json

    cuda = ROOT / "results" / "benchmarks" / "cuda"
    at, before = ({r["variant"]: r for r in json.loads((cuda / f"attention_layer_magnitude_4096_bf16{x}.json")
                                                        .read_text())["results"] if not r.get("compiled")}
                  for x in ("", "_log_prior"))  # the eager rows (--compile adds a compiled row after each)
    causal, prefix, standard = at["magnitude-causal-lowrank"], at["magnitude-prefix-logits-lowrank"], at["standard"]
    speed = " ".join((DOCS / "speed.md").read_text().split())
    assert (f"costs {causal['layer_fwd_bwd_ratio']:.2f}x the raw-SDPA layer forward+backward, "
            f"the prefix layer (the solve, then the low-rank kernel) {prefix['layer_fwd_bwd_ratio']:.2f}x") in speed
    assert all(r["layer_fwd_bwd_ratio"] > 2 for v, r in at.items() if v != "standard")  # "both miss the target"
    old = before["magnitude-causal-lowrank"]
    assert (f"read {old['layer_fwd_bwd_ratio']:.2f}x and "
            f"{before['magnitude-prefix-logits-lowrank']['layer_fwd_bwd_ratio']:.2f}x") in speed
    assert (f"went from {old['layer_fwd_bwd_ms']:.2f} to {causal['layer_fwd_bwd_ms']:.1f} ms") in speed
    assert prefix["layer_fwd_bwd_ratio"] < before["magnitude-prefix-logits-lowrank"]["layer_fwd_bwd_ratio"]
    total = {v: r["profile"]["total_ms"] for v, r in at.items()}
    assert (f"causal layer sum to {total['magnitude-causal-lowrank']:.1f} ms against its median of "
            f"{causal['layer_fwd_bwd_ms']:.1f} ms, and the prefix layer's to {total['magnitude-prefix-logits-lowrank']:.1f} "
            f"against {prefix['layer_fwd_bwd_ms']:.1f} ms; the standard layer's take {total['standard']:.2f} of its "
            f"{standard['layer_fwd_bwd_ms']:.2f} ms") in speed
    busy = [total[v] / at[v]["layer_fwd_bwd_ms"] for v in ("magnitude-causal-lowrank", "magnitude-prefix-logits-lowrank")]
    assert 0.4 < busy[0] < 0.6 and 0.55 < busy[1] < 0.7  # "waits ... about half ... and a third"
    top = {t["name"]: t for t in causal["profile"]["top"]}
    trsm = [t for name, t in top.items() if "trsm" in name]
    assert len(trsm) == 3 and f"batched triangular solves ({sum(t['ms'] for t in trsm):.2f} ms in the causal layer" in speed
    assert any("potrf" in name for name in top) and any("gemm_f32f32" in name for name in top)
    assert sorted(top.values(), key=lambda t: -t["ms"])[0]["name"].startswith("cudnn")  # SDPA's backward, then the solve
    kernels = {t["name"]: t["ms"] for t in prefix["profile"]["top"] if t["name"].startswith("_")}
    assert (f"the three Triton kernels take {sum(kernels.values()):.2f} ms (dq {kernels['_dq_kernel']:.2f}, dK/dV "
            f"{kernels['_dkdv_kernel']:.2f}, forward {kernels['_forward_kernel']:.2f})") in speed
    low = {r["T"]: r["routes"] for r in json.loads((cuda / "kernels_lowrank.json").read_text())["lowrank"]}
    assert abs(sum(kernels.values()) / low[4096]["kernel"]["ms"] - 1) < 0.05  # "the time the kernel table gives"


def test_the_kernel_resource_prose_is_the_saved_report():
    """docs/speed.md's sentences on the kernels' registers and spills, from kernel_resources_sm90.json."""
    import json

    rows = json.loads((ROOT / "results" / "benchmarks" / "cuda" / "kernel_resources_sm90.json").read_text())["rows"]
    at = {(r["kernel"], r["block_m"], r["num_warps"]): r for r in rows}
    speed = " ".join((DOCS / "speed.md").read_text().split())
    today = [at[f"lowrank.{k}[GATE=0]", 64, 4] for k in ("_dkdv_kernel", "_dq_kernel")]
    assert all(r["regs"] == 255 and r["stack_bytes"] > 0 for r in today)
    assert f"spill ({today[0]['stack_bytes']} and {today[1]['stack_bytes']} bytes per thread with the prior)" in speed
    square = {(r["kernel"], r["num_warps"]): r for r in rows if r["kernel"].startswith("lowrank._d")
              and "ieee" not in r["kernel"] and r["block_m"] == 64}
    free = [key for key, r in square.items() if r["stack_bytes"] == 0]  # "only the dq kernel with 8 warps"
    assert free == [("lowrank._dq_kernel[GATE=0]", 8)], free
    assert f"only the dq kernel with 8 warps stops spilling ({square[free[0]]['regs']} registers)" in speed
    assert all(at[f"perkey.{k}", 64, 4]["stack_bytes"] == 0 for k in ("_dkdv_kernel", "_dq_kernel"))  # "do not"


def test_the_backward_tile_prose_is_the_saved_report():
    """docs/speed.md's sentences on the low-rank backward kernels with their own (outer, inner) tiles, from
    kernel_resources_backward_sm90.json (the dK/dV kernel's BLOCK_N and the dq kernel's BLOCK_M are the outer)."""
    import json

    rows = json.loads((ROOT / "results" / "benchmarks" / "cuda" / "kernel_resources_backward_sm90.json").read_text())
    at = {}
    for r in rows["rows"]:
        outer, inner = (r["block_n"], r["block_m"]) if "_dkdv_" in r["kernel"] else (r["block_m"], r["block_n"])
        at[r["kernel"], outer, inner, r["num_warps"]] = r
    speed = " ".join((DOCS / "speed.md").read_text().split())
    prior = [at[f"lowrank.{k}[GATE=0]", 64, 16, 4] for k in ("_dkdv_kernel", "_dq_kernel")]
    assert all(r["stack_bytes"] == 0 for r in prior)
    assert f"neither backward kernel of the prior spills ({prior[0]['regs']} and {prior[1]['regs']} registers)" in speed
    gate = at["lowrank._dkdv_kernel[GATE=1]", 64, 16, 4]["stack_bytes"]
    assert gate > 0 and f"the value gate's dK/dV kernel still spills {gate} bytes" in speed
    default = [at[f"lowrank.{k}[GATE=0]", 64, 32, 4]["stack_bytes"] for k in ("_dkdv_kernel", "_dq_kernel")]
    assert default[1] == 0 and f"the prior's dK/dV kernel spills {default[0]} bytes and its dq kernel none" in speed
    assert f"with the 4 warps the backward launches ({at['lowrank._dkdv_kernel[GATE=0]', 128, 16, 4]['stack_bytes']} " \
           f"bytes at (128, 16))" in speed
    eight = [at[f"lowrank.{k}[GATE=0]", 64, 32, 8] for k in ("_dkdv_kernel", "_dq_kernel")]
    assert all(r["stack_bytes"] == 0 for r in eight)
    assert f"(64, 32) stops spilling ({eight[0]['regs']} and {eight[1]['regs']} registers, no stack)" in speed


def test_the_one_exp_per_score_table_is_the_two_saved_reports():
    """docs/speed.md's table of special-function (MUFU) and instruction counts of the low-rank prior's kernels,
    before (kernel_resources_log_prior_sm90.json, the kernels at e65b646) and now (kernel_resources_sm90.json), at
    64 x 64 with 4 warps, beside the per-key kernel's; and the dK/dV kernel's spill at (64, 32) before and now."""
    import json

    cuda = ROOT / "results" / "benchmarks" / "cuda"
    before = json.loads((cuda / "kernel_resources_log_prior_sm90.json").read_text())
    now = json.loads((cuda / "kernel_resources_sm90.json").read_text())
    backward = json.loads((cuda / "kernel_resources_backward_sm90.json").read_text())
    assert before["kernels_at"].startswith("e65b646")

    def row(report, kernel, block_m=64, block_n=64, warps=4):
        return next(r for r in report["rows"] if (r["kernel"], r["block_m"], r["block_n"], r["num_warps"])
                    == (kernel, block_m, block_n, warps))

    def mufu(r):
        return ", ".join(f"{n} {op}" for op, n in sorted(r["mufu"].items()))

    speed = " ".join((DOCS / "speed.md").read_text().split())
    for label, name in (("forward", "_forward_kernel"), ("dK/dV", "_dkdv_kernel"), ("dq", "_dq_kernel")):
        old, new = row(before, f"lowrank.{name}[GATE=0]"), row(now, f"lowrank.{name}[GATE=0]")
        flash = row(now, f"perkey.{name}")
        assert new["mufu"]["EX2"] == flash["mufu"]["EX2"] == old["mufu"]["EX2"]
        assert new["mufu"]["RCP"] < old["mufu"]["RCP"] and new["instructions"] < old["instructions"]
        assert (f"| {label} | {mufu(old)} | {mufu(new)} | {mufu(flash)} | {old['instructions']:,} | "
                f"{new['instructions']:,} |") in speed
    spills = [row(report, "lowrank._dkdv_kernel[GATE=0]", 32, 64, w)["stack_bytes"]
              for w in (4, 8) for report in (before, backward)]
    assert spills[3] == 0
    assert (f"the dK/dV kernel's spill fell from {spills[0]} to {spills[1]} bytes with 4 warps and from {spills[2]} "
            f"to none with 8") in speed


def test_per_seed_tables_fold_and_the_rest_stays_open():
    text = "#### Results\n\n| a |\n|---|\n| 1 |\n\n#### Final validation loss per seed\n\n| s |\n|---|\n| 2 |\n\n#### Gates\n\n| g |\n"
    assert generate.collapse(text, ("Final validation loss per seed",)) == (
        "#### Results\n\n| a |\n|---|\n| 1 |\n\n??? note \"Final validation loss per seed\"\n\n    | s |\n    |---|\n"
        "    | 2 |\n\n#### Gates\n\n| g |\n")


def test_the_dilution_pages_positions_table_is_the_saved_grids():
    """docs/dilution.md's table of the language model under three encodings: each cell's mean final validation loss
    and its lead (minus the paired difference from standard) recomputed from results/*/results.json at 4 decimals."""
    grids = {"learned positions": {"standard": "dilution-lm-1", "selective": "dilution-lm-2",
                                   "stick-breaking": "dilution-lm-4"},
             "RoPE": {"standard": "dilution-rope-lm", "selective": "dilution-rope-lm",
                      "stick-breaking": "dilution-rope-lm-2"},
             "ALiBi": {"standard": "dilution-alibi-lm", "selective": "dilution-alibi-lm"},
             "no positions": {"standard": "dilution-nope-lm", "stick-breaking": "dilution-nope-lm"}}

    def cell(grid, variant):
        primary = json.loads((ROOT / "results" / grid / "results.json").read_text())["primary"]
        row = next(r for r in primary["variants"] if r["variant"] == variant)
        mean = f"{row['summary']['mean']:.4f}"
        return mean if variant == "standard" else f"{mean} (lead {-row['difference']:.4f})"

    columns = list(grids)
    expected = ["| variant | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"] + [
        f"| `{v}` | " + " | ".join(cell(grids[c][v], v) if v in grids[c] else "n/a" for c in columns) + " |"
        for v in ("standard", "selective", "stick-breaking")]
    page = (ROOT / "docs" / "dilution.md").read_text(encoding="utf-8")
    assert "\n".join(expected) in page


def test_the_flex_cost_prose_is_the_saved_benchmark():
    """docs/speed.md's sentences on FlexAttention's layer cost on a GPU, from the three saved runs (and SSMax on SDPA
    from the dilution page's GPU run)."""
    cuda = ROOT / "results" / "benchmarks" / "cuda"

    def rows(stem):
        return {r["variant"]: r for r in json.loads((cuda / f"{stem}.json").read_text())["results"]}

    plain, capped, alibi = (rows(f"attention_layer_flex{x}_bf16") for x in ("", "_softcap", "_alibi"))
    auto = rows("attention_layer_dilution_bf16")
    assert all(r["path"] == "flex" for run in (plain, capped, alibi) for r in run.values())
    speed = " ".join((DOCS / "speed.md").read_text().split())
    assert (f"FlexAttention's own cost is the first row: {plain['standard']['layer_fwd_bwd_ratio']:.2f}x the flash "
            f"layer forward+backward with nothing to modify. SSMax ({plain['ssmax']['layer_fwd_bwd_ratio']:.2f}x), a "
            f"softcap ({capped['standard']['layer_fwd_bwd_ratio']:.2f}x) and ALiBi "
            f"({alibi['standard']['layer_fwd_bwd_ratio']:.2f}x)") in speed
    assert (f"the forward alone ({capped['standard']['layer_fwd_ratio']:.2f}x against "
            f"{plain['standard']['layer_fwd_ratio']:.2f}x)") in speed
    explicit = [r["layer_fwd_bwd_ratio"] for r in auto.values() if r["path"] == "explicit" and r["variant"] != "selective"]
    assert "which costs about 8x on an H100" in speed and all(7.5 < x < 8.5 for x in explicit)
    assert auto["ssmax"]["path"] == "sdpa" and f"({auto['ssmax']['layer_fwd_bwd_ratio']:.2f}x in the same table)" in speed
    variants = " ".join((DOCS / "variants.md").read_text().split())
    assert (f"capped layer cost {capped['standard']['layer_fwd_bwd_ratio']:.2f}x the flash layer forward+backward, "
            "against about 8x for the explicit path there") in variants


def test_the_dilution_pages_gpu_cost_prose_is_the_saved_benchmark():
    """docs/dilution.md's sentences on the GPU cost table, from results/benchmarks/cuda/attention_layer_dilution_bf16.json."""
    at = {r["variant"]: r for r in json.loads((ROOT / "results" / "benchmarks" / "cuda" /
                                               "attention_layer_dilution_bf16.json").read_text())["results"]}
    page = " ".join((DOCS / "dilution.md").read_text().split())

    def x(v):
        return f"{at[v]['layer_fwd_bwd_ratio']:.2f}x"

    assert (f"SSMax ({x('ssmax')}), the output gate ({x('gated')}) and differential attention ({x('differential')}) "
            f"stay close to flash; the sink ({x('sink')}) and the duplicate-count prior ({x('count-prior')})") in page
    assert (f"Softpick, stick-breaking and selective attention take the explicit path at {x('softpick')}, "
            f"{x('stick-breaking')} and {x('selective')}") in page
    assert all(at[v]["path"] == "explicit" for v in ("softpick", "stick-breaking", "selective"))
    assert (f"The exact magnitude logit prior costs {x('magnitude-prefix-logits')}; its low-rank form, on the Triton "
            f"kernel ([one exponential per score](speed.md#one-exp-per-score), backward tiles (64, 32)), "
            f"{x('magnitude-prefix-logits-lowrank')}") in page
    assert at["magnitude-prefix-logits-lowrank"]["path"] == "triton"


def test_the_docs_table_labels_compiled_rows():
    """benchmarks/attention_layer.py --compile's rows: the layer table names them compiled."""
    row = {"variant": "standard", "path": "sdpa", "sdpa_path": True, "layer_fwd_ms": 1.0, "layer_fwd_ratio": 1.0,
           "layer_fwd_bwd_ms": 2.0, "layer_fwd_bwd_ratio": 1.0, "core_fwd_ratio": None}
    lines = generate.layer_rows({"results": [row, {**row, "compiled": True}]}, core=False)
    assert lines[2].startswith("| `standard` | sdpa |") and lines[3].startswith("| `standard`, compiled | sdpa |")
