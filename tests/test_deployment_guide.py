"""The deployment guide (docs/how-to: install, Helm, Composer): its snippets load, its install line resolves.

Every config snippet of those pages (the ``[kinetic]`` ini block, the ``export`` lines, the Helm
values' ``env``, Composer's overrides) names real ``[kinetic]`` options with values that parse,
read through Airflow's own configuration in a fresh process; the connection parses as an Airflow
connection; the Helm values fit the official chart's schema (the facts needed, restated with
their source in ``tests/data/airflow_chart_values_facts.json``: no ``helm`` binary is packaged
for Debian or npm); ``docker/Dockerfile.airflow``'s pip line resolves with the wheel built from
this checkout.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import jsonschema
import pytest
import yaml

from kinetic_airflow import __version__
from kinetic_airflow.options import OPTIONS, parse_setting

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ("docs/how-to/install.md", "docs/how-to/helm.md", "docs/how-to/composer.md")


def _section() -> str:
    """The deployment guide's pages, one after the other."""
    return "\n".join((ROOT / page).read_text() for page in GUIDE)


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", _section(), flags=re.DOTALL)


def _exports() -> dict[str, str]:
    found: dict[str, str] = {}
    for block in _blocks("bash"):
        for line in block.splitlines():
            if line.startswith("export "):
                for word in shlex.split(line)[1:]:
                    name, _, value = word.partition("=")
                    found[name] = value
    return found


def _helm_values() -> dict:
    section = _section()
    after = section[section.index("<!-- helm-values -->") :]
    return yaml.safe_load(re.search(r"```yaml\n(.*?)```", after, flags=re.DOTALL).group(1))


def _composer_overrides() -> dict[str, str]:
    (flag,) = re.findall(r"--update-airflow-configs=(\S+)", _section())
    return dict(pair.split("=", 1) for pair in flag.split(","))


def _check_kinetic_settings(settings: dict[str, str], where: str) -> None:
    """Each name is a [kinetic] option and its value parses by the option table's rules."""
    assert settings, f"no [kinetic] settings found in {where}"
    for key, value in settings.items():
        spec = OPTIONS.get(key)
        assert spec is not None and spec.config, f"{where}: {key} is not a [kinetic] option"
        parse_setting(key, value, f"{where} {key}")


def _through_airflow_conf(env: dict[str, str], keys: list[str], tmp_path: Path) -> dict:
    """The values kinetic resolves in a fresh process whose only configuration is ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__KINETIC__", "KINETIC_"))}
    clean.update({"AIRFLOW_HOME": str(tmp_path / "home"), "AIRFLOW_CONFIG": str(tmp_path / "airflow.cfg")})
    clean.update(env)
    code = (
        "import json, sys\nfrom kinetic_airflow.config import resolve_setting\n"
        "print(json.dumps({k: resolve_setting(k) for k in sys.argv[1:]}, default=str))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *keys], capture_output=True, text=True, env=clean, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_ini_block_loads_through_airflows_config(tmp_path):
    (block,) = [b for b in _blocks("ini") if "[kinetic]" in b]
    parser = configparser.ConfigParser()
    parser.read_string(block)
    settings = dict(parser["kinetic"])
    _check_kinetic_settings(settings, "the guide's [kinetic] block")
    (tmp_path / "airflow.cfg").write_text(block)
    resolved = _through_airflow_conf({}, list(settings), tmp_path)
    assert resolved == settings


def test_the_environment_variables_load_through_airflows_config(tmp_path):
    exports = _exports()
    kinetic = {
        name.removeprefix("AIRFLOW__KINETIC__").lower(): value
        for name, value in exports.items()
        if name.startswith("AIRFLOW__KINETIC__")
    }
    _check_kinetic_settings(kinetic, "the guide's export")
    (tmp_path / "airflow.cfg").write_text("")
    resolved = _through_airflow_conf(
        {k: v for k, v in exports.items() if k.startswith("AIRFLOW__")}, list(kinetic), tmp_path
    )
    assert resolved == kinetic
    assert set(exports) - {f"AIRFLOW__KINETIC__{k.upper()}" for k in kinetic} == {
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"
    }


def test_the_connection_is_an_airflow_gcp_connection():
    from airflow.models.connection import Connection

    value = _exports()["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"]
    conn = Connection.from_json(value, conn_id="google_cloud_default")
    assert conn.conn_type == "google_cloud_platform"
    assert conn.extra_dejson["key_path"].endswith(".json")


def test_helm_values_fit_the_official_charts_schema():
    facts = json.loads((ROOT / "tests/data/airflow_chart_values_facts.json").read_text())
    values = _helm_values()
    jsonschema.validate(values, facts)
    env = {item["name"]: item["value"] for item in values["env"]}
    assert all(name.startswith("AIRFLOW__KINETIC__") for name in env)
    _check_kinetic_settings(
        {name.removeprefix("AIRFLOW__KINETIC__").lower(): value for name, value in env.items()},
        "the guide's Helm values env",
    )
    (secret,) = values["secret"]
    assert secret["envName"] == "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"
    # The image tag the guide builds with docker/Dockerfile.airflow is the one the values deploy.
    assert f"-t my-airflow:{values['images']['airflow']['tag']}" in _section()


def test_a_wrong_helm_key_is_caught_by_the_schema_facts():
    """The schema facts are strict where the chart is: a misspelt key fails the check."""
    facts = json.loads((ROOT / "tests/data/airflow_chart_values_facts.json").read_text())
    values = _helm_values()
    values["secret"][0]["secretkey"] = values["secret"][0].pop("secretKey")
    with pytest.raises(jsonschema.ValidationError, match="secretkey"):
        jsonschema.validate(values, facts)


def test_composer_overrides_are_kinetic_options():
    overrides = _composer_overrides()
    assert all(key.startswith("kinetic-") for key in overrides)
    _check_kinetic_settings(
        {key.removeprefix("kinetic-"): value for key, value in overrides.items()}, "the guide's Composer"
    )
    assert f'"kinetic-airflow[gke]=={__version__}"' in _section()


def _dockerfile_args(text: str) -> dict[str, str]:
    args = {}
    for name, value in re.findall(r"^ARG (\w+)(?:=(.*))?$", text, flags=re.MULTILINE):
        if value:
            args[name] = value.strip('"')
    return args


def test_dockerfile_airflow_pip_line_resolves_with_the_built_wheel(built_wheel, tmp_path):
    text = (ROOT / "docker/Dockerfile.airflow").read_text()
    assert re.search(r"^FROM apache/airflow:\$\{AIRFLOW_VERSION\}-python\$\{PYTHON_VERSION\}$", text, re.M)
    args = _dockerfile_args(text)
    assert args["KINETIC_AIRFLOW"] == f"kinetic-airflow[gke]=={__version__}"
    (run,) = re.findall(r"^RUN (pip install .*)$", text, flags=re.MULTILINE)
    words = shlex.split(run)
    assert words[:3] == ["pip", "install", "--no-cache-dir"]
    assert "--constraint" in words and words[words.index("--constraint") + 1] == "${CONSTRAINTS}"
    assert "apache-airflow==${AIRFLOW_VERSION}" in words and "${KINETIC_AIRFLOW}" in words
    # The same line, with what a build would substitute: the Airflow release of this test
    # environment (its constraints: that release itself) and the wheel in place of the PyPI name.
    installed = version("apache-airflow")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"apache-airflow=={installed}\n")
    subst = {
        "${AIRFLOW_VERSION}": installed,
        "${KINETIC_AIRFLOW}": f"kinetic-airflow[gke] @ {built_wheel.as_uri()}",
        "${CONSTRAINTS}": str(constraints),
    }
    line = [subst.get(word, word.replace("${AIRFLOW_VERSION}", installed)) for word in words[2:]]
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--report", str(report), *line],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    wanted = {item["metadata"]["name"]: item for item in json.loads(report.read_text())["install"]}
    assert wanted["kinetic-airflow"]["metadata"]["version"] == __version__
    assert wanted["kinetic-airflow"]["download_info"]["url"] == built_wheel.as_uri()
