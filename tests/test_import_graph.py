"""The package's import graph, read from the source with ``ast`` (nothing of it is imported).

Three rules keep the layout honest:

* the import graph has no cycle (the Kubernetes emulator under ``emulator/cluster_emulator``
  is its own room and is left out): not among the imports at the top of the modules, nor once
  the imports inside functions are added - a cycle that only works because one side imports
  inside a function is a layering mistake waiting to bite;
* an import inside a function is allowed only with a comment on its line or the line before
  saying why (an optional dependency, Airflow's start-up cost in a CLI or in job pods, a lazily
  chosen backend) - otherwise it belongs at the top of the module;
* ``kinetic_airflow.job`` (what runs inside a job pod, where Airflow is not installed) imports
  nothing of Airflow and nothing of kinetic_airflow outside ``job/``, at any level.

Run ``python tests/test_import_graph.py`` for the figures: modules at the top level, import
layers (the longest path in the module-level graph), cycles.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kinetic_airflow"
EMULATOR = "cluster_emulator"  # its own distribution (emulator/), outside the package
JOB = f"{PACKAGE}.job"


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it stands and whether it runs at module import."""

    importer: str
    target: str  # dotted name as written (absolute)
    line: int
    function_level: bool


@dataclass
class Graph:
    modules: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)
    sources: dict[str, list[str]] = field(default_factory=dict)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _collect(module: str, is_package: bool, tree: ast.Module) -> list[Import]:
    found: list[Import] = []

    def absolute(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            # Seen by type checkers only; never executed, so no runtime edge.
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(module, alias.name, node.lineno, in_function))
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node)
            for alias in node.names:
                found.append(Import(module, f"{base}.{alias.name}", node.lineno, in_function))
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def read_graph() -> Graph:
    graph = Graph()
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        name = module_name(path)
        graph.modules[name] = path
        text = path.read_text()
        graph.sources[name] = text.splitlines()
        graph.imports.extend(_collect(name, path.name == "__init__.py", ast.parse(text, str(path))))
    return graph


def resolve(graph: Graph, target: str) -> list[str]:
    """The package's modules an import of ``target`` runs: the module itself and its packages.

    ``from a.b import c`` names ``a.b.c``: a submodule when there is one, else a name in ``a.b``.
    """
    parts = target.split(".")
    if parts[0] != PACKAGE:
        return []
    while parts and ".".join(parts) not in graph.modules:
        parts.pop()
    return [".".join(parts[:i]) for i in range(2, len(parts) + 1)]


def edges(graph: Graph, *, function_level: bool) -> dict[str, set[str]]:
    """Importer -> imported modules; with ``function_level`` only the imports inside functions.

    A package's own ``__init__`` is not an edge from its members (Python has it loaded already).
    """
    out: dict[str, set[str]] = {name: set() for name in graph.modules}
    for imp in graph.imports:
        if imp.function_level != function_level:
            continue
        for target in resolve(graph, imp.target):
            if target != imp.importer and not imp.importer.startswith(target + "."):
                out[imp.importer].add(target)
    return out


def cycles(out: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def strongconnect(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(out.get(node, ())):
            if nxt not in index:
                strongconnect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(out):
        if node not in index:
            strongconnect(node)
    return sorted(found)


def layers(out: dict[str, set[str]]) -> int:
    """Modules on the longest import chain, cycles folded into one node each."""
    component_of: dict[str, int] = {}
    for number, component in enumerate(cycles(out)):
        for member in component:
            component_of[member] = number
    node = {name: ("c", component_of[name]) if name in component_of else ("m", name) for name in out}
    dag: dict[tuple, set[tuple]] = {}
    for src, targets in out.items():
        dag.setdefault(node[src], set()).update(node[t] for t in targets if node[t] != node[src])
    depth: dict[tuple, int] = {}

    def longest(n: tuple) -> int:
        if n not in depth:
            depth[n] = 1 + max((longest(m) for m in dag.get(n, ())), default=0)
        return depth[n]

    return max((longest(n) for n in dag), default=0)


def without_emulator(out: dict[str, set[str]]) -> dict[str, set[str]]:
    def kept(name: str) -> bool:
        return not (name == EMULATOR or name.startswith(EMULATOR + "."))

    return {src: {t for t in targets if kept(t)} for src, targets in out.items() if kept(src)}


def has_reason(graph: Graph, imp: Import) -> bool:
    """A comment on the import's line, or above it: directly, or above the run of imports it is in."""
    lines = graph.sources[imp.importer]
    if "#" in lines[imp.line - 1]:
        return True
    above = imp.line - 2
    while above >= 0 and _continues_imports(lines[above]):
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


def _continues_imports(line: str) -> bool:
    text = line.strip()
    return text.startswith(("from ", "import ")) or text == ")" or (text.endswith(",") and " " not in text)


GRAPH = read_graph()


def test_module_level_imports_have_no_cycle() -> None:
    found = cycles(without_emulator(edges(GRAPH, function_level=False)))
    assert not found, "module-level import cycles (move the shared code below both sides): " + "; ".join(
        " -> ".join(c) for c in found
    )


def test_no_cycle_even_through_imports_inside_functions() -> None:
    """An import inside a function hides a cycle from Python, not from the layering: none either."""
    module_level = edges(GRAPH, function_level=False)
    function_level = edges(GRAPH, function_level=True)
    found = cycles(without_emulator({m: module_level[m] | function_level[m] for m in module_level}))
    shown = "; ".join(" -> ".join(c) for c in found)
    assert not found, f"import cycles through imports inside functions: {shown}"


def test_every_function_level_import_says_why() -> None:
    silent = [
        f"{GRAPH.modules[imp.importer].relative_to(ROOT)}:{imp.line}: import {imp.target}"
        for imp in GRAPH.imports
        if imp.function_level and not imp.importer.startswith(EMULATOR + ".") and not has_reason(GRAPH, imp)
    ]
    assert not silent, (
        "imports inside functions without a comment saying why (an optional dependency, Airflow's "
        "start-up cost, a lazily chosen backend); move them to the top of the module or say why:\n"
        + "\n".join(silent)
    )


def test_job_package_imports_nothing_of_airflow_or_the_rest() -> None:
    assert JOB in GRAPH.modules, f"{JOB} is missing"
    wrong = []
    for imp in GRAPH.imports:
        if not (imp.importer == JOB or imp.importer.startswith(JOB + ".")):
            continue
        top = imp.target.split(".")[0]
        # the package's own __init__ (its version; it imports nothing eagerly) is allowed
        ran = resolve(GRAPH, imp.target) or [imp.target.rsplit(".", 1)[0]]
        inside = all(t in (JOB, PACKAGE) or t.startswith(JOB + ".") for t in ran)
        if top == "airflow" or (top == PACKAGE and not inside):
            wrong.append(f"{GRAPH.modules[imp.importer].relative_to(ROOT)}:{imp.line}: import {imp.target}")
    assert not wrong, "kinetic_airflow.job runs in job pods without Airflow:\n" + "\n".join(wrong)


def test_job_runner_starts_without_airflow() -> None:
    """What a pod runs (``python -m kinetic_airflow.runner``) loads no Airflow module at all."""
    probe = (
        "import sys, runpy, kinetic_airflow.runner, kinetic_airflow.job.runner;"
        "bad = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.'));"
        "print(bad[:5]); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, f"the runner imported Airflow: {done.stdout} {done.stderr[-2000:]}"


def figures(graph: Graph) -> str:
    module_level = edges(graph, function_level=False)
    function_level = edges(graph, function_level=True)
    combined = {m: module_level[m] | function_level[m] for m in module_level}
    top = [m for m, p in graph.modules.items() if p.parent == ROOT / PACKAGE and p.name != "__init__.py"]
    lines = [f"modules at the top level of {PACKAGE}: {len(top)}"]
    for title, out in (
        ("module-level", module_level),
        ("module-level, without the emulator", without_emulator(module_level)),
        ("module- and function-level, without the emulator", without_emulator(combined)),
    ):
        found = cycles(out)
        sizes = sorted((len(c) for c in found), reverse=True)
        lines.append(f"{title}: layers {layers(out)}, cycles {len(found)} (sizes {sizes})")
        lines.extend(f"    {' '.join(c)}" for c in found)
    inside = [i for i in graph.imports if i.function_level and not i.importer.startswith(EMULATOR + ".")]
    lines.append(
        f"function-level imports outside the emulator: {len(inside)}"
        f" (of the package's own modules: {sum(1 for i in inside if resolve(graph, i.target))})"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    print(figures(GRAPH))
