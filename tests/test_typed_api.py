"""The typed API: py.typed ships, mypy keeps the decorated function's signature and rejects unknown
options (tests/typed_dags/: a DAG mypy passes and one whose every `# BAD` line it must reject)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path

from helpers import machine_cache

import kinetic_airflow

TYPED = Path(__file__).resolve().parent / "typed_dags"
ROOT = Path(__file__).resolve().parent.parent


def test_mypy_keeps_signatures_and_rejects_unknown_options():
    files = [TYPED / "typed_ok.py", TYPED / "typed_bad.py"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--follow-imports=silent",  # report this DAG's errors, not Airflow's or the package's own
            "--warn-unused-ignores",
            "--cache-dir",
            str(machine_cache("mypy")),  # warm on a second run: mypy rechecks only what changed
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    errors = [line for line in result.stdout.splitlines() if ": error: " in line]
    assert not [e for e in errors if "typed_ok.py" in e], result.stdout  # the typed example is clean
    bad_lines = {
        n for n, text in enumerate((TYPED / "typed_bad.py").read_text().splitlines(), 1) if "# BAD" in text
    }
    flagged = {int(m[1]) for e in errors if (m := re.match(r".*typed_bad\.py:(\d+): error", e))}
    assert flagged == bad_lines, result.stdout
    text = result.stdout
    assert 'Unexpected keyword argument "accelerater" for overloaded function "kinetic_task"' in text
    assert 'did you mean "accelerator"' in text
    assert 'Unexpected keyword argument "epochs"' in text  # train() keeps def train(lr: float)
    assert 'Unexpected keyword argument "acelerator" for "KineticRunOperator"' in text
    assert 'Argument "retries" to "KineticRunOperator" has incompatible type "str"' in text


def test_py_typed_ships_with_the_package():
    assert (Path(kinetic_airflow.__file__).parent / "py.typed").is_file()
    assert '"py.typed"' in (ROOT / "pyproject.toml").read_text()


def test_typed_options_are_the_operators_options():
    """kinetic_task's typed keywords are KineticRunOperator's options plus BaseOperator's arguments."""
    from airflow.sdk import BaseOperator

    from kinetic_airflow import KineticRunOperator, kinetic_task
    from kinetic_airflow.typed_args import OperatorArgs, TaskArgs

    base = {p for p in inspect.signature(BaseOperator.__init__).parameters if p not in ("self", "kwargs")}
    assert set(OperatorArgs.__annotations__) == base
    assert set(TaskArgs.__annotations__) == base - {"multiple_outputs"}
    operator = {
        p
        for p in inspect.signature(KineticRunOperator.__init__).parameters
        if p not in ("self", "kwargs", "python_callable", "op_args", "op_kwargs")
    }
    with_options = typing.get_overloads(kinetic_task)[1]
    decorator = {
        p for p in inspect.signature(with_options).parameters if p not in ("python_callable", "kwargs")
    }
    decorator -= {"multiple_outputs"}
    assert decorator == operator, (
        "kinetic_task's typed options (the second overload in kinetic_airflow/decorators.py) must be "
        f"KineticRunOperator's: add {sorted(operator - decorator)}, drop {sorted(decorator - operator)}"
    )
    # ... with the same types and defaults, so mypy holds a DAG to what the parse-time checks hold it to
    ours = inspect.signature(KineticRunOperator.__init__).parameters
    theirs = inspect.signature(with_options).parameters
    drift = {
        name: (
            str(ours[name].annotation),
            ours[name].default,
            str(theirs[name].annotation),
            theirs[name].default,
        )
        for name in operator
        if (ours[name].annotation, ours[name].default) != (theirs[name].annotation, theirs[name].default)
    }
    assert not drift, f"operator vs kinetic_task (annotation, default): {drift}"


def test_every_option_has_a_row_in_the_option_table():
    """The parse-time checks (kinetic_airflow/options.py) cover every option and every [kinetic] setting."""
    from kinetic_airflow import KineticRunOperator
    from kinetic_airflow.config import BACKENDS, DEFAULTS
    from kinetic_airflow.get_provider_info import get_provider_info
    from kinetic_airflow.options import OPTIONS, task_option_names
    from kinetic_airflow.typed_args import BackendName

    operator = [
        p
        for p in inspect.signature(KineticRunOperator.__init__).parameters
        if p not in ("self", "kwargs", "python_callable", "op_args", "op_kwargs")
    ]
    assert list(task_option_names()) == operator
    assert {n for n, spec in OPTIONS.items() if spec.config} == set(DEFAULTS)
    assert {n for n, spec in OPTIONS.items() if spec.templated} == set(KineticRunOperator.template_fields) - {
        "op_args",
        "op_kwargs",
    }
    assert OPTIONS["backend"].choices == BACKENDS == typing.get_args(BackendName)
    # the config's declared types agree with the table's kinds
    kinds = {"float": "duration", "integer": "count", "boolean": "bool"}
    declared = get_provider_info()["config"]["kinetic"]["options"]
    assert set(declared) == set(DEFAULTS)
    for name, option in declared.items():
        if option["type"] in kinds:
            assert OPTIONS[name].kind == kinds[option["type"]], name
        else:
            assert OPTIONS[name].kind not in kinds.values(), name
