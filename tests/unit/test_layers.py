"""The layers of rigfleet/ and roles/ only point down (docs/architecture.md, "Layers").

Read with ``ast`` (nothing is imported), the import graph of every module under rigfleet/ and
roles/ must have no circle and no import from a lower layer to a higher one; no module may be
over 800 lines, no module docstring over 30 lines. Each failure names the module and the rule.

How imports are counted: every ``import``/``from ... import`` statement anywhere in a module
counts, at module level, inside a function (a lazy import) or under ``if TYPE_CHECKING:``: a
lazy import only postpones the circle to the first call, and a type-only import still ties the
two modules together. ``from a.b import c`` is an edge to module ``a.b.c`` when that is a
module, else to ``a.b``; an import of ``a.b.c`` is not counted as an edge to the package
``a.b`` (its ``__init__``) as well, so a package's ``__init__`` may import its own modules.
Imports of anything outside rigfleet/ and roles/ are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("rigfleet", "roles")
MAX_LINES = 800
MAX_DOCSTRING_LINES = 30

# The layers, lowest first (docs/architecture.md's table): a module may import its own layer
# and the ones below. A module's layer is that of its longest prefix listed here; every module
# must have one.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("contract", ("rigfleet.hostside.layout", "rigfleet.hostside.records",
                  "rigfleet.hostside.plan")),
    ("host tool", ("rigfleet.hostside",)),
    ("base", ("rigfleet", "rigfleet.errors", "rigfleet.validate", "rigfleet.tables",
              "rigfleet.resources", "rigfleet.commands", "rigfleet.vllm_versions",
              "rigfleet.genesis_inspect", "rigfleet.sshconfig",
              "rigfleet.retention", "rigfleet.gpu", "rigfleet.packages", "rigfleet.registry",
              "rigfleet.hub", "rigfleet.hostbundle",
              "rigfleet.keytable")),
    ("data", ("rigfleet.pins", "rigfleet.hostdata", "rigfleet.hostchecks", "rigfleet.aptrepos",
              "rigfleet.tlsfiles", "rigfleet.catalog",
              "rigfleet.catalog_keys", "rigfleet.stack_docs", "rigfleet.image_sources",
              "rigfleet.inventory", "rigfleet.genesis", "rigfleet.weights", "rigfleet.fleetcache",
              # an unfinished bump's journal beside the pins file, and the plan it keeps
              "rigfleet.bump.journal", "rigfleet.bump.plan")),
    # Reading a host or a source: SSH, the host probe and its record, pyinfra facts, apt.
    ("host access", ("rigfleet.ssh", "rigfleet.hostprobe", "rigfleet.facts",
                     "rigfleet.aptindex")),
    ("model", ("rigfleet.desired", "rigfleet.compose", "rigfleet.runtime_image")),
    ("decisions", ("rigfleet.swapplan", "rigfleet.status.drift",
                   "rigfleet.balancer", "rigfleet.images.plan",
                   "rigfleet.images.archive", "rigfleet.images.hoststate",
                   "rigfleet.doctor.rules", "rigfleet.doctor.evidence",
                   "rigfleet.bump.candidate", "rigfleet.scrape", "rigfleet.vllmargs")),
    # What the roles and the commands share: image transfers, Genesis mirrors, the rollout
    # engine, the online checks, host selection, the fleet view.
    ("orchestration", ("rigfleet.fleetview", "rigfleet.images", "rigfleet.bump.genesis",
                       "rigfleet.bump.rollout",
                       "rigfleet.roll", "rigfleet.cliargs", "rigfleet.check",
                       "rigfleet.balancer.status", "rigfleet.monitor.query",
                       "rigfleet.monitor.page")),
    ("roles", ("roles",)),
    ("commands for people", ("rigfleet.cli", "rigfleet.status", "rigfleet.bump",
                             "rigfleet.bench", "rigfleet.doctor", "rigfleet.images.cli",
                             "rigfleet.endpoints", "rigfleet.lockcmd",
                             "rigfleet.logs", "rigfleet.pinlock", "rigfleet.rollback")),
)

def _module_files() -> dict[str, Path]:
    files = {}
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


FILES = _module_files()


def _resolve(name: str) -> str | None:
    while name and name not in FILES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> dict[str, int]:
    """The modules of rigfleet/ and roles/ that ``module`` imports, each with a line number."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in FILES else source
                     for a in node.names]
        for name in names:
            target = _resolve(name)
            if target and target != module:
                found.setdefault(target, node.lineno)
    return found


GRAPH = {module: _imports(module, path) for module, path in FILES.items()}


def layer_of(module: str) -> int | None:
    best, level = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    return level


def _circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _docstring_lines(path: Path) -> int:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    first = tree.body[0] if tree.body else None
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


def test_the_graph_sees_lazy_and_type_only_imports():
    """The graph is real: known module-level, lazy, type-only and relative imports are edges."""
    assert "rigfleet.genesis_inspect" in GRAPH["rigfleet.catalog"]
    assert "rigfleet.catalog" in GRAPH["rigfleet.stack_docs"]
    assert "rigfleet.catalog" in GRAPH["rigfleet.genesis"]  # under if TYPE_CHECKING only
    assert "rigfleet.hostside.verify.checks" in GRAPH["rigfleet.hostside.verify.runner"]
    tree = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert _circles(tree) == [["a", "b", "c"]]


def test_no_import_circle():
    circles = _circles(GRAPH)
    lines = []
    for circle in circles:
        members = set(circle)
        edges = [f"{a}:{GRAPH[a][b]} -> {b}" for a in circle for b in GRAPH[a] if b in members]
        lines.append("import circle: " + "; ".join(edges))
    assert not lines, "\n".join(lines)


def test_every_module_has_a_layer():
    missing = [m for m in FILES if layer_of(m) is None]
    assert not missing, ("modules in no layer (add them to LAYERS in tests/unit/test_layers.py "
                         f"and to docs/architecture.md): {', '.join(missing)}")


def _upward(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import from a lower layer to a higher one, as ``path:line: ...`` lines."""
    upward = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module)
        for target, line in sorted(targets.items()):
            theirs = layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                where = FILES[module].relative_to(ROOT) if module in FILES else module
                upward.append(f"{where}:{line}: {module} ({LAYERS[mine][0]}) imports {target} "
                              f"({LAYERS[theirs][0]}): an import from a lower layer to a "
                              "higher one")
    return upward


def test_the_layer_rule_is_checked():
    """The rule itself: down and sideways pass, up fails; the table places modules as the
    docs do."""
    order = ["rigfleet.hostside.layout", "rigfleet.hostside.steps", "rigfleet.pins",
             "rigfleet.desired", "rigfleet.swapplan", "roles.swap", "rigfleet.bump.cli"]
    levels = [layer_of(m) for m in order]
    assert levels == sorted(set(levels), key=lambda x: -1 if x is None else x), levels
    assert _upward({"rigfleet.desired": {"rigfleet.pins": 3, "rigfleet.compose": 4}}) == []
    assert _upward({"rigfleet.hostdata": {"rigfleet.images.plan": 7}}) == [
        "rigfleet/hostdata.py:7: rigfleet.hostdata (data) imports rigfleet.images.plan "
        "(decisions): an import from a lower layer to a higher one"]


def test_imports_only_point_down():
    upward = _upward(GRAPH)
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("module", sorted(FILES))
def test_module_size(module):
    path = FILES[module]
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, (f"{path.relative_to(ROOT)}: {lines} lines; a module has at most "
                                f"{MAX_LINES} (split it along a real seam)")
    doc = _docstring_lines(path)
    assert doc <= MAX_DOCSTRING_LINES, (
        f"{path.relative_to(ROOT)}: module docstring of {doc} lines; at most "
        f"{MAX_DOCSTRING_LINES} (what and why, a usage example; the essay goes to docs/)")
