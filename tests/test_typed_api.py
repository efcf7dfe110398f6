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


def test_typed_options_are_the_option_tables():
    """kinetic_task's and KineticRunOperator's typed keywords are the table's task options (its
    TypedDict) plus BaseOperator's arguments; the operator's runtime signature, which Airflow reads
    for default_args and .partial()/.expand(), names the same options with the table's types and
    defaults."""
    from airflow.sdk import BaseOperator

    from kinetic_airflow import KineticRunOperator, kinetic_task
    from kinetic_airflow.options import OPTIONS, TaskOptions, task_option_names
    from kinetic_airflow.typed_args import OperatorArgs, OperatorOptions, TaskArgs, TaskWithOptions

    base = {p for p in inspect.signature(BaseOperator.__init__).parameters if p not in ("self", "kwargs")}
    assert set(OperatorArgs.__annotations__) == base
    assert set(TaskArgs.__annotations__) == base - {"multiple_outputs"}
    options = list(TaskOptions.__annotations__)
    assert options == list(task_option_names())
    assert not set(options) & base, "a task option shadows a BaseOperator argument"
    assert set(OperatorOptions.__annotations__) == base | set(options)
    assert set(TaskWithOptions.__annotations__) == (base - {"multiple_outputs"}) | set(options)
    with_options = typing.get_overloads(kinetic_task)[1]
    assert [p.name for p in inspect.signature(with_options).parameters.values()] == [
        "python_callable",
        "multiple_outputs",
        "kwargs",
    ]
    assert "TaskWithOptions" in str(inspect.signature(with_options).parameters["kwargs"].annotation)
    parameters = inspect.signature(KineticRunOperator.__init__).parameters
    named = [p for p in parameters if p not in ("self", "kwargs", "python_callable", "op_args", "op_kwargs")]
    assert named == options
    hints = typing.get_type_hints(TaskOptions, include_extras=False, localns={"Data": kinetic_airflow.Data})
    for name in options:
        parameter = parameters[name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert parameter.default == OPTIONS[name].parameter_default, name
        assert (
            typing.get_type_hints(
                type("Probe", (), {"__annotations__": {"x": parameter.annotation}}),
                localns={"Data": kinetic_airflow.Data},
            )["x"]
            == hints[name]
        ), name
    # a setting the task can also give defaults to None there (the [kinetic] value), the others to
    # the table's default
    assert parameters["poll_interval"].default is None and OPTIONS["poll_interval"].default == 2.0
    assert parameters["accelerator"].default == "cpu" and parameters["deferrable"].default is True


def test_the_option_table_feeds_config_template_fields_and_the_provider_section():
    """config's defaults, the operator's template fields and get_provider_info's [kinetic] section
    are the table's, with the declared types Airflow's config parser reads."""
    from kinetic_airflow import KineticRunOperator
    from kinetic_airflow.config import BACKENDS, DEFAULTS
    from kinetic_airflow.get_provider_info import get_provider_info
    from kinetic_airflow.options import OPTIONS
    from kinetic_airflow.typed_args import BackendName

    assert {n for n, spec in OPTIONS.items() if spec.config} == set(DEFAULTS)
    assert {n for n, spec in OPTIONS.items() if spec.templated} == set(KineticRunOperator.template_fields) - {
        "op_args",
        "op_kwargs",
    }
    assert OPTIONS["backend"].choices == BACKENDS == typing.get_args(BackendName)
    kinds = {"float": "duration", "integer": "count", "boolean": "bool"}
    declared = get_provider_info()["config"]["kinetic"]["options"]
    assert set(declared) == set(DEFAULTS)
    for name, option in declared.items():
        if option["type"] in kinds:
            assert OPTIONS[name].kind == kinds[option["type"]], name
        else:
            assert OPTIONS[name].kind not in kinds.values(), name
        assert option["description"] and option["example"], name
        # Airflow's config parser reads the declared default back as the setting's value
        if DEFAULTS[name] is None:
            assert option["default"] is None, name
        else:
            assert str(option["default"]).lower() == str(DEFAULTS[name]).lower().replace(".0", ""), name
    assert declared["poll_interval"]["default"] == "2"
    assert declared["use_internal_ip"]["default"] == "false"
    assert declared["requirements_cache"]["default"] == "auto"  # emptydir on Autopilot, else hostpath
