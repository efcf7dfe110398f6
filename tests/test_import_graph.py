"""The package's layers: import-linter's contracts, and the one rule import-linter cannot check.

The contracts (``[tool.importlinter]`` in pyproject.toml, run here with ``lint-imports``) hold the
layers: every module of ``kinetic_airflow`` has its row, top down, and imports only its own row or
rows below it; ``kinetic_airflow.job`` (what runs in a job pod, where Airflow is not installed)
imports nothing of Airflow and nothing of kinetic_airflow outside ``job/``; backends do not import
the operator layer; the cluster emulator (``emulator/``, its own distribution) imports nothing of
the product; no package's modules import each other in a cycle. Imports inside functions count.

Read here from the source with ``ast`` (nothing of it is imported): an import inside a function
is allowed only with a comment on its line or the line before saying why (an optional
dependency, Airflow's start-up cost in a CLI or in job pods, a lazily chosen backend); otherwise
it belongs at the top of the module. And the runner, started as a pod starts it, loads no Airflow
module at all (import-linter reads imports, not what a dependency loads).
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


def test_the_import_contracts_hold() -> None:
    """``lint-imports`` (import-linter) keeps every contract in pyproject.toml."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout, done.stdout[-3000:]


def test_the_contracts_say_what_the_layers_are() -> None:
    """The rules the package keeps are contracts import-linter runs: the layers (exhaustive, so a
    new module needs its row), job/ alone, backends below the operator layer, the emulator apart,
    no cycles."""
    from importlinter.api import read_configuration

    config = read_configuration(str(ROOT / "pyproject.toml"))
    contracts = {c["id"]: c for c in config["contracts_options"]}
    assert config["session_options"]["root_packages"] == [PACKAGE, EMULATOR]
    assert contracts["layers"]["type"] == "layers" and contracts["layers"]["exhaustive"] == "True"
    assert contracts["job-stands-alone"]["forbidden_modules"] == ["airflow", f"{PACKAGE}.*"]
    operator_layer = {
        f"{PACKAGE}.{m}" for m in ("operators", "decorators", "triggers", "ui", "cli", "plugin")
    }
    assert operator_layer <= set(contracts["backends-below-the-operator-layer"]["forbidden_modules"])
    assert contracts["emulator-apart"]["forbidden_modules"] == [PACKAGE]
    assert contracts["no-cycles"]["type"] == "acyclic_siblings"
    rows = [row.split(" : ") for row in contracts["layers"]["layers"]]
    assert rows.index(["config"]) < rows.index(["options"]), "config reads the option table, not the reverse"
