"""The package's layers point one way and no import cycle comes back.

The import graph is read from the source with ``ast`` (every ``import`` statement, function-level ones included,
since a late import only hides a cycle), independently of what Python happens to have loaded. An import of
``a.b.c`` also runs the packages ``a.b`` (their ``__init__``), so it counts as an edge to them too, except to the
importer's own packages (those are already being initialised).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "attnlab"

# bottom to top: a module may import its own layer (without cycles) and the layers below, never one above
LAYERS = [
    {"errors", "atomic", "lock", "configio", "rundir", "weights", "switches", "lazy"},
    {"functional", "tasks"},
    {"mechanisms"},
    {"attention_config", "registry", "config", "hf", "data"},
    {"nn"},
    {"model"},
    {"analysis"},
    {"train"},
    {"presets", "experiments"},
    {"verify"},
    {"cli", "__init__"},
]


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    mods = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the package modules it imports}, for every module of ``package``."""
    mods = _modules(package)
    graph = {}
    for name, path in mods.items():
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                stem = ".".join(base[: len(base) - node.level + 1] + [node.module] if node.module else
                                base[: len(base) - node.level + 1]) if node.level else node.module
                subs = [f"{stem}.{a.name}" for a in node.names if f"{stem}.{a.name}" in mods]
                found = subs if len(subs) == len(node.names) else [stem, *subs]  # names from stem's __init__
            else:
                continue
            for target in found:
                while target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in mods:
                    targets.update(t for t in (*_ancestors(target), target) if t in mods)
        graph[name] = {t for t in targets if t != name and t not in _ancestors(name) and t != package.name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _layer(module: str) -> int:
    unit = module.split(".")[1] if "." in module else "__init__"
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"{module}: its unit {unit!r} is in no layer of LAYERS; place it there")


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_layers_point_one_way():
    upward = [f"{a} -> {b}" for a, targets in import_graph().items() for b in targets if _layer(b) > _layer(a)]
    assert upward == []


@pytest.mark.parametrize("planted", [
    ("a/x.py", "from .y import f\n", "a/y.py", "def f():\n    from .x import g\n"),  # a late import still counts
    ("a/x.py", "from . import y\n", "a/y.py", "from .x import g\n"),
    ("a/x.py", "import pkg.a.y\n", "a/y.py", "from ..b import h\n"),  # through the package b's __init__
])
def test_a_planted_cycle_is_found(tmp_path, planted):
    pkg = tmp_path / "pkg"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "b" / "__init__.py").write_text("from ..a.x import z\n")
    (pkg / planted[0]).write_text(planted[1])
    (pkg / planted[2]).write_text(planted[3])
    assert cycles(import_graph(pkg)) != []


def test_the_own_package_and_submodule_imports_are_not_cycles(tmp_path):
    pkg = tmp_path / "pkg" / "a"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("from .a import f\n")
    (pkg / "__init__.py").write_text("from .x import f\nfrom . import y\n")
    (pkg / "x.py").write_text("from . import y\ndef f():\n    pass\n")
    (pkg / "y.py").write_text("import math\n")
    assert cycles(import_graph(tmp_path / "pkg")) == []


# {(importing file, imported test module): why}: the one deliberate exception, an import inside a function (so pytest
# collects nothing twice) whose purpose is to run the other module's tests as an oracle
IMPORTS_ALLOWED = {("test_prose_numbers.py", "test_study_prose"): "the prose-number sweep runs test_study_prose's "
                   "tests with recording page texts, to count the phrases they recompute"}


def test_test_files_do_not_import_each_other():
    """Shared test code lives in tests/helpers.py; a test module importing another would run its tests twice."""
    tests = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    found = []
    for path in (ROOT / "tests").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name} imports {n}" for n in names if n.split(".")[0] in tests
                      and ((path.name, n) not in IMPORTS_ALLOWED or id(node) in top)]
    assert found == []


def _string_constants(package: Path = PACKAGE):
    """(module path, node, whether it is a dict key) for every node of every module of ``package``."""
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        keys = {id(k) for node in ast.walk(tree) if isinstance(node, ast.Dict) for k in node.keys}
        for node in ast.walk(tree):
            yield path, node, id(node) in keys


def test_run_directory_file_names_have_one_home():
    """The names of a run's and a comparison's files are spelled in attnlab/rundir.py only; the trainer, compare,
    report and the sweep import them (a name spelled twice would drift)."""
    import attnlab.rundir as R

    names = {getattr(R, n) for n in R.__all__ if n.endswith(("_FILE", "_DIR"))}
    assert {"config.toml", "metrics.jsonl", "summary.json", "checkpoint", "compare.toml"} <= names
    found = [f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}" for path, node, is_key in _string_constants()
             if isinstance(node, ast.Constant) and node.value in names and path.name != "rundir.py"
             and not is_key]  # a summary.json key named "checkpoint" is not the folder's name
    assert found == []


def test_option_tuples_are_defined_once():
    """A literal tuple (list, set) of two or more strings stands in one place in the package: the allowed values
    of a switch are named once and imported wherever they are checked."""
    seen = {}
    for path, node, _ in _string_constants():
        if (isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)):
            seen.setdefault(tuple(e.value for e in node.elts), []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert {values: places for values, places in seen.items() if len(places) > 1} == {}


def test_the_redesign_measures_hold():
    """docs/contributing.md#redesign: AttentionConfig has 17 top-level fields (the magnitude, head and projection
    switches are tables of their own), and no module of the package is longer than the largest the page names (605 lines):
    a new switch goes into its mechanism's table, and a long module is split before it grows past that."""
    import dataclasses

    from attnlab import AttentionConfig

    added_since = ("ssmax", "output_gate", "sink", "selective", "differential", "alibi", "softcap")  # mechanisms with one on/off switch and no table of their own, added after the redesign
    assert [f.name for f in dataclasses.fields(AttentionConfig)][17:] == list(added_since)
    page = (ROOT / "docs" / "contributing.md").read_text()
    assert "| `AttentionConfig` top-level fields | 40 | 17 " in page
    longest = max((len(p.read_text(encoding="utf-8").splitlines()), p.relative_to(PACKAGE).as_posix())
                  for p in PACKAGE.rglob("*.py"))
    assert longest[0] <= 605, longest
    assert "`experiments/report.py`, 605 lines" in page


def test_no_lazy_export_is_shadowed_by_a_submodule():
    """A package's lazily exported name (:mod:`attnlab.lazy`) must not also name one of its submodules: importing
    that submodule first sets the package attribute to the module, and the export's ``__getattr__`` never runs. Run in
    a fresh interpreter that imports every home module before it looks a name up, the order that broke
    ``from attnlab.experiments import compare`` once."""
    import subprocess
    import sys

    script = """
import importlib, pkgutil, types, attnlab
for info in pkgutil.walk_packages(attnlab.__path__, 'attnlab.'):
    if not info.ispkg:
        continue
    pkg = importlib.import_module(info.name)
    names = getattr(pkg, '__all__', [])
    if 'lazy_exports' not in open(pkg.__file__, encoding='utf-8').read():
        continue
    subs = {m.name for m in pkgutil.iter_modules(pkg.__path__)}
    for sub in subs:
        importlib.import_module(info.name + '.' + sub)
    for name in names:
        value = getattr(pkg, name)
        assert not isinstance(value, types.ModuleType), f'{info.name}.{name} is the submodule, not the export'
    print(info.name, len(names))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "attnlab.experiments" in out.stdout
