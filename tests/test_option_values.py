"""Every option value is checked when the DAG file is parsed, for ``@task.kinetic`` and the classic
``KineticRunOperator`` alike (kinetic_airflow/options.py): a wrong one is a DAG import error that
names the option and the fix; a right one, in each form the option accepts, works. Templated
options are checked once rendered, and ``[kinetic]`` / ``KINETIC_*`` values by the same rules,
before any job exists."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from helpers import ti_states

# (option, the value as written in the DAG file, what the import error must say besides the
# option's name: the problem and the fix)
WRONG = [
    ("spot", "'false'", ["is a string, not a bool", "write spot=False"]),
    ("spot", "'yes'", ["is a string, not a bool", "write spot=True"]),
    ("spot", "1", ["is an int, not a bool", "write spot=True"]),
    ("spot", "None", ["is None, not a bool", "write spot=True or spot=False"]),
    ("deferrable", "'False'", ["is a string, not a bool", "write deferrable=False"]),
    ("deferrable", "0", ["is an int, not a bool", "write deferrable=False"]),
    (
        "poll_interval",
        "'2s'",
        ["is a string, not a duration", "poll_interval=2 or poll_interval=timedelta(seconds=2)"],
    ),
    ("poll_interval", "'5'", ["is a string", "write poll_interval=5"]),
    ("poll_interval", "0", ["must be more than 0", "e.g. poll_interval=5"]),
    ("poll_interval", "-1.5", ["must be more than 0"]),
    ("poll_interval", "timedelta(seconds=-3)", ["must be more than 0", "datetime.timedelta"]),
    ("poll_interval", "float('nan')", ["is not a finite number of seconds"]),
    ("poll_interval", "True", ["is a bool, not a duration"]),
    ("heartbeat_seconds", "'thirty'", ["is a string, not a duration", "e.g. heartbeat_seconds=30"]),
    ("heartbeat_seconds", "timedelta(0)", ["must be more than 0"]),
    ("startup_timeout", "'30m'", ["startup_timeout=1800 or startup_timeout=timedelta(minutes=30)"]),
    ("startup_timeout", "[1800]", ["is a list, not a duration"]),
    ("preemption_retries", "-1", ["must be 0 or more", "e.g. preemption_retries=3"]),
    ("preemption_retries", "'3'", ["is a string, not a whole number", "write preemption_retries=3"]),
    ("preemption_retries", "2.5", ["is a float, not a whole number"]),
    ("preemption_retries", "2.0", ["is a float", "write preemption_retries=2"]),
    ("preemption_retries", "True", ["is a bool, not a whole number"]),
    ("backend", "'kubernetes'", ["is not one of local, gke, pathways, auto", "Did you mean backend='gke'?"]),
    ("backend", "'GKE'", ["Did you mean backend='gke'?"]),
    ("backend", "'pathway'", ["Did you mean backend='pathways'?"]),
    ("backend", "1", ["is an int, not a name", 'e.g. backend="gke"']),
    (
        "container_env",
        "['KERAS_BACKEND=jax']",
        ["is a list, not a dict", "write container_env={'KERAS_BACKEND': 'jax'}"],
    ),
    (
        "container_env",
        "{'EPOCHS': 4}",
        ["int as the value of 'EPOCHS'", "container_env={..., 'EPOCHS': '4'}"],
    ),
    ("container_env", "{'DEBUG': True}", ["bool as the value of 'DEBUG'", "'DEBUG': 'true'"]),
    ("container_env", "{'MY VAR': 'x'}", ["not an environment variable name"]),
    ("container_env", "'KERAS_BACKEND=jax'", ["is a string, not a dict", "{'KERAS_BACKEND': 'jax'}"]),
    ("volumes", "['/data']", ["must be a dict of absolute mount path", 'Example: volumes={"/data"']),
    ("volumes", "{'/data': '/tmp/ds'}", ["must be a kinetic_airflow.Data object", "Data('/tmp/ds')"]),
    ("volumes", "{'data': Data('/tmp')}", ["must be an absolute path such as '/data'"]),
    ("pod_override", "'{\"spec\": {}}'", ["a task argument takes the dict itself", "pod_override={"]),
    ("pod_override", "['spec']", ["must be a dict in Kubernetes' JSON shape", "V1Pod"]),
    ("pod_override", "{'containers': []}", ["'containers' is not part of a pod", "'metadata'"]),
    (
        "capture_env_vars",
        "'WANDB_API_KEY'",
        ["is a string, not a list", "write capture_env_vars=['WANDB_API_KEY']"],
    ),
    ("capture_env_vars", "'WANDB_*, MYAPP_TOKEN'", ["write capture_env_vars=['WANDB_*', 'MYAPP_TOKEN']"]),
    ("capture_env_vars", "{'WANDB_API_KEY': 'k'}", ["not values", "capture_env_vars=['WANDB_API_KEY']"]),
    (
        "capture_env_vars",
        "[1]",
        ["must be a list of variable names or wildcard patterns", "['WANDB_API_KEY'"],
    ),
    ("requirements", "{'numpy': '>=1.26'}", ["is a dict", "write requirements=['numpy>=1.26']"]),
    (
        "requirements",
        "['numpy', 2]",
        ["has 2, an int, among its items", 'e.g. requirements=["scikit-learn>=1.4"]'],
    ),
    ("namespace", "'ML_Jobs'", ["is not a valid Kubernetes namespace", "write namespace='ml-jobs'"]),
    ("namespace", "''", ["is empty", "namespace=None (or leave it out)"]),
    ("zone", "5", ["is an int, not a string", 'e.g. zone="us-central1-a"']),
    ("project", "['my-project']", ["is a list, not a string", 'e.g. project="my-project"']),
    ("gcp_conn_id", "123", ["is an int, not a string", 'e.g. gcp_conn_id="google_cloud_default"']),
    ("accelerator", "8", ["is an int, not an accelerator string", 'e.g. accelerator="gpu-l4"']),
    ("accelerator", "'tpu-v6e-8tt'", ["Did you mean 'tpu-v6e-8t'?", "8t"]),
    ("output_dir", "'checkpoints'", ["is a relative path", 'output_dir="gs://bucket/checkpoints"']),
    ("base_uri", "'s3://bucket/kinetic'", ["does not support the s3:// scheme", "use gs://bucket/prefix"]),
    ("capacity", "'flex-strat'", ["is not a capacity", "Did you mean capacity='flex-start'?"]),
    ("capacity", "'reservation'", ["Name it: capacity='reservation:<name>'"]),
    ("capacity", "7", ["is not a string", "reservation:<name>"]),
    ("local_queue", "'Team_A'", ["is not a Kueue object name", "write local_queue='team-a'"]),
    ("priority_class", "''", ["is not a Kueue object name"]),
    ("max_run_duration", "'12h'", ["is a string, not a duration", "max_run_duration=43200"]),
    ("queue_timeout", "0", ["must be more than 0"]),
    ("slices", "0", ["must be 1 or more", "e.g. slices=2"]),
    ("slices", "'2'", ["is a string, not a whole number", "write slices=2"]),
    ("slices", "2", ["multislice needs a multi-host TPU slice such as 'tpu-v6e-16'"]),
]

FORMS = ("decorator", "operator")
# how every message gives the fix: the value to write, a suggestion, an example or the form
FIX = re.compile(
    r"; write |Did you mean |, e\.g\. |Example: |Wrap the path: |pass their names: |looks like |; use "
)

_HEAD = """
import pendulum
from datetime import timedelta
from airflow.sdk import dag, task
from kinetic_airflow import Data, KineticRunOperator

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def job():
    return 1
"""

_DECORATOR = """
@task.kinetic({option}={value})
def job_task():
    return 1


@dag(dag_id="{dag_id}", schedule=None, start_date=START)
def the_dag():
    job_task()


the_dag()
"""

_OPERATOR = """
@dag(dag_id="{dag_id}", schedule=None, start_date=START)
def the_dag():
    KineticRunOperator(task_id="job_task", python_callable=job, {option}={value})


the_dag()
"""


def _dag_file(folder: Path, name: str, form: str, option: str, value: str) -> Path:
    body = (_DECORATOR if form == "decorator" else _OPERATOR).format(option=option, value=value, dag_id=name)
    path = folder / f"{name}.py"
    path.write_text(_HEAD + body)
    return path


def _case_id(index: int, form: str) -> str:
    option = WRONG[index][0]
    return f"{form}-{option}-{index}"


@pytest.fixture(scope="module")
def parsed_wrong(tmp_path_factory):
    """One DagBag (Airflow's own DAG-file parsing) over a folder with a DAG file per wrong value and form."""
    from airflow.dag_processing.dagbag import DagBag

    folder = tmp_path_factory.mktemp("wrong_options")
    files = {}
    for index, (option, value, _) in enumerate(WRONG):
        for form in FORMS:
            name = _case_id(index, form).replace("-", "_")
            files[(index, form)] = str(_dag_file(folder, name, form, option, value))
    bag = DagBag(dag_folder=str(folder))
    return bag, files


def test_the_table_is_long_enough():
    import kinetic_airflow
    from kinetic_airflow.options import KineticOptionError

    assert len(WRONG) >= 30 and len({option for option, _, _ in WRONG}) >= 18
    # one public type to catch, which is also what the built-in checks raise
    assert kinetic_airflow.KineticOptionError is KineticOptionError
    assert issubclass(KineticOptionError, TypeError) and issubclass(KineticOptionError, ValueError)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("index", range(len(WRONG)), ids=[f"{o}={v}" for o, v, _ in WRONG])
def test_a_wrong_value_is_a_dag_import_error_naming_the_option_and_the_fix(parsed_wrong, index, form):
    bag, files = parsed_wrong
    option, value, fragments = WRONG[index]
    error = bag.import_errors.get(files[(index, form)])
    assert error is not None, f"{option}={value} ({form}) was accepted at parse time"
    assert option in error
    for fragment in fragments:
        assert fragment in error, error
    assert FIX.search(error), f"no fix in: {error}"
    assert not [d for d in bag.dags if d == _case_id(index, form).replace("-", "_")]


# (option, the value as written, the value the operator holds): every accepted form
RIGHT = [
    ("spot", "False", False),
    ("spot", "True", True),
    ("deferrable", "False", False),
    ("poll_interval", "2", 2.0),
    ("poll_interval", "0.25", 0.25),
    ("poll_interval", "timedelta(seconds=3)", 3.0),
    ("heartbeat_seconds", "timedelta(milliseconds=1500)", 1.5),
    ("startup_timeout", "timedelta(minutes=30)", 1800.0),
    ("startup_timeout", "600", 600.0),
    ("preemption_retries", "0", 0),
    ("preemption_retries", "5", 5),
    ("backend", "'local'", "local"),
    ("backend", "'auto'", "auto"),
    ("backend", "None", None),
    (
        "container_env",
        "{'KERAS_BACKEND': 'jax', 'RUN': '{{ run_id }}'}",
        {"KERAS_BACKEND": "jax", "RUN": "{{ run_id }}"},
    ),
    ("container_env", "{}", {}),
    ("capture_env_vars", "['WANDB_*']", ["WANDB_*"]),
    ("capture_env_vars", "('WANDB_API_KEY', 'MYAPP_*')", ["WANDB_API_KEY", "MYAPP_*"]),
    ("requirements", "'scikit-learn>=1.4'", "scikit-learn>=1.4"),
    ("requirements", "('numpy', 'pandas')", ["numpy", "pandas"]),
    ("namespace", "'ml-jobs'", "ml-jobs"),
    ("namespace", "'{{ params.ns }}'", "{{ params.ns }}"),
    ("accelerator", "'{{ params.accelerator }}'", "{{ params.accelerator }}"),
    ("accelerator", "'tpu-v6e-8t'", "tpu-v6e-8t"),
    ("output_dir", "'gs://bucket/runs/exp1'", "gs://bucket/runs/exp1"),
    ("output_dir", "'/mnt/checkpoints'", "/mnt/checkpoints"),
    ("base_uri", "'file:///tmp/kinetic'", "file:///tmp/kinetic"),
    ("pod_override", "{'metadata': {'labels': {'team': 'ml'}}}", {"metadata": {"labels": {"team": "ml"}}}),
]


def test_every_accepted_form_parses_and_is_held_normalized(tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    names = {}
    for index, (option, value, _) in enumerate(RIGHT):
        for form in FORMS:
            name = f"right_{form}_{option}_{index}"
            names[(index, form)] = name
            _dag_file(tmp_path, name, form, option, value)
    bag = DagBag(dag_folder=str(tmp_path))
    assert bag.import_errors == {}
    for (index, _form), name in names.items():
        option, _, held = RIGHT[index]
        task = bag.dags[name].get_task("job_task")
        assert getattr(task, option) == held, (name, getattr(task, option))
        assert type(getattr(task, option)) is type(held), name


def test_a_mapped_classic_operator_is_checked_at_parse_time():
    """``KineticRunOperator.partial(...)`` builds no operator until the task runs: its options are
    checked when ``partial`` is called."""
    from airflow.sdk import DAG

    from kinetic_airflow import KineticRunOperator
    from kinetic_airflow.options import KineticOptionError

    with DAG("mapped_options", schedule=None), pytest.raises(KineticOptionError, match="write spot=False"):
        KineticRunOperator.partial(task_id="t", python_callable=print, spot="false").expand(
            op_args=[[1], [2]]
        )


def test_dag_default_args_are_checked_too():
    from airflow.sdk import DAG

    from kinetic_airflow import KineticRunOperator
    from kinetic_airflow.options import KineticOptionError

    with DAG("defaults", schedule=None, default_args={"poll_interval": "2s"}):
        with pytest.raises(KineticOptionError, match=r"poll_interval='2s' is a string"):
            KineticRunOperator(task_id="t", python_callable=print)


def test_a_decorated_function_no_dag_calls_is_still_checked():
    from kinetic_airflow import kinetic_task
    from kinetic_airflow.options import KineticOptionError

    with pytest.raises(KineticOptionError, match="write preemption_retries=3"):

        @kinetic_task(preemption_retries="3")
        def never_called():
            return 1


# Templated options, after rendering; configured values: before any job exists ----------------
def _dag(name: str):
    import kn_options

    return kn_options.DAGS[name]


def _jobs(base: Path) -> list[str]:
    root = base / "jobs"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_templated_options_are_checked_after_rendering_before_any_job(tmp_path, monkeypatch):
    base = tmp_path / "kinetic"
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{base}")
    monkeypatch.setenv("KN_TEST_FAILURES", str(tmp_path))
    dr = _dag("kn_rendered_options").test()
    assert ti_states(dr) == {
        "bad_accelerator": "failed",
        "bad_namespace": "failed",
        "bad_output_dir": "failed",
        "good": "success",
    }
    failures = {
        t: (tmp_path / f"{t}.txt").read_text() for t in ("bad_accelerator", "bad_namespace", "bad_output_dir")
    }
    assert "Invalid accelerator 'tpu-v6e-8tt'" in failures["bad_accelerator"]
    assert "Did you mean 'tpu-v6e-8t'?" in failures["bad_accelerator"]
    assert (
        "namespace (as rendered)='Not_A_Namespace' is not a valid Kubernetes namespace"
        in failures["bad_namespace"]
    )
    assert "write namespace='not-a-namespace'" in failures["bad_namespace"]
    assert "output_dir (as rendered)='relative/dir' is a relative path" in failures["bad_output_dir"]
    assert len(_jobs(base)) == 1  # only the good task made a job


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("AIRFLOW__KINETIC__POLL_INTERVAL", "2s", "takes a number of seconds, e.g. 2 or 0.5 (no unit)"),
        ("KINETIC_POLL_INTERVAL", "-1", "is out of range (must be more than 0)"),
        ("AIRFLOW__KINETIC__HEARTBEAT_SECONDS", "0", "is out of range (must be more than 0)"),
        ("KINETIC_PREEMPTION_RETRIES", "three", "takes a whole number, e.g. 3 (no unit)"),
        ("AIRFLOW__KINETIC__LOG_MAX_LINES", "-5", "must be 0 or more"),
        ("AIRFLOW__KINETIC__WAIT_BEFORE_DEFER", "5 s", "does not parse"),
        (
            "AIRFLOW__KINETIC__KINETIC_INTEROP",
            "maybe",
            "is not a boolean: kinetic_interop takes true or false",
        ),
        (
            "AIRFLOW__KINETIC__BACKEND",
            "kubernetes",
            "is not one of local, gke, pathways, auto (did you mean gke?)",
        ),
        ("KINETIC_XCOM_MAX_BYTES", "1MB", "takes a whole number, e.g. 262144 (no unit)"),
    ],
)
def test_a_configured_value_is_checked_before_any_job_naming_its_source(
    tmp_path, monkeypatch, variable, value, expected
):
    base = tmp_path / "kinetic"
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{base}")
    monkeypatch.setenv("KN_TEST_FAILURES", str(tmp_path))
    if variable.startswith("KINETIC_"):  # the [kinetic] value must not shadow it
        monkeypatch.delenv("AIRFLOW__KINETIC__" + variable[len("KINETIC_") :], raising=False)
    monkeypatch.setenv(variable, value)
    dr = _dag("kn_configured_options").test()
    assert ti_states(dr) == {"uses_the_config": "failed"}
    kind, message = (tmp_path / "uses_the_config.txt").read_text().split("\n", 1)
    assert kind == "kinetic_airflow.options.KineticSettingError"
    assert variable in message and repr(value) in message and expected in message
    assert _jobs(base) == []


def test_the_heartbeat_must_come_before_the_job_counts_as_lost(monkeypatch):
    from types import SimpleNamespace

    from kinetic_airflow.config import KineticSettingError
    from kinetic_airflow.submission import check_settings

    monkeypatch.setenv("AIRFLOW__KINETIC__HEARTBEAT_TIMEOUT", "20")
    task = SimpleNamespace(heartbeat_seconds=30.0, poll_interval=None, namespace=None)
    with pytest.raises(
        KineticSettingError, match=r"heartbeat_seconds=30 is not less than \[kinetic\] heartbeat_timeout=20"
    ):
        check_settings(task, "gke")
    check_settings(task, "local")  # no heartbeat timeout on the local backend
    check_settings(SimpleNamespace(heartbeat_seconds=timedelta(seconds=5).total_seconds()), "gke")


# Right values, end to end: spot=False stays off in the Job the cluster gets ---------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from emulated_cluster import running_emulator

    with running_emulator(tmp_path_factory) as running:
        yield running


def test_option_forms_run_end_to_end_and_spot_false_stays_off(cluster, tmp_path, monkeypatch):
    import kubernetes
    from emulated_cluster import point_kinetic_at
    from helpers import xcom

    point_kinetic_at(*cluster, monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    monkeypatch.setenv("KN_OPTION_FLAVOUR", "captured")
    dr = _dag("kn_option_forms").test()
    assert ti_states(dr) == {"on_demand": "success", "on_spot": "success", "classic_on_demand": "success"}
    assert xcom(dr, "on_demand") == "on-demand captured"  # container_env and a tuple of capture patterns
    assert xcom(dr, "classic_on_demand") == "classic"
    batch = kubernetes.client.BatchV1Api(cluster[0].api_client())
    jobs = {
        job.metadata.labels["kinetic.airflow/task-id"]: job
        for job in batch.list_namespaced_job("default").items
        if job.metadata.labels.get("kinetic.airflow/dag-id", "").startswith("kn-option-forms")
    }
    assert set(jobs) == {"on-demand", "on-spot", "classic-on-demand"}, sorted(jobs)

    def spot_selector(task: str) -> str | None:
        return (jobs[task].spec.template.spec.node_selector or {}).get("cloud.google.com/gke-spot")

    def spot_tolerations(task: str) -> list:
        tolerations = jobs[task].spec.template.spec.tolerations or []
        return [t for t in tolerations if t.key == "cloud.google.com/gke-spot"]

    assert spot_selector("on-demand") is None and spot_tolerations("on-demand") == []
    assert spot_selector("classic-on-demand") is None and spot_tolerations("classic-on-demand") == []
    assert spot_selector("on-spot") == "true" and len(spot_tolerations("on-spot")) == 1


def test_cluster_settings_are_checked_for_cluster_backends(monkeypatch):
    """A local deployment is not failed by a cluster-only setting; a cluster task is, before any job."""
    from types import SimpleNamespace

    from kinetic_airflow.config import KineticSettingError
    from kinetic_airflow.submission import check_settings

    monkeypatch.setenv("KINETIC_NAMESPACE", "ML_Jobs")
    monkeypatch.setenv("AIRFLOW__KINETIC__REQUIREMENTS_CACHE", "tmpfs")
    task = SimpleNamespace(namespace=None)
    check_settings(task, "local")
    with pytest.raises(
        KineticSettingError, match=r"KINETIC_NAMESPACE='ML_Jobs' is not a valid Kubernetes namespace"
    ):
        check_settings(task, "gke")
    monkeypatch.delenv("KINETIC_NAMESPACE")
    with pytest.raises(
        KineticSettingError, match=r"REQUIREMENTS_CACHE\)='tmpfs' is not one of auto, hostpath, emptydir"
    ):
        check_settings(task, "pathways")


# Deliberate differences from keras-kinetic 0.0.4, shown on kinetic itself ----------------------
_KINETIC_PROBE = """
import json, os
from kinetic.backend import k8s_utils
from kinetic.core import core

os.environ.update({"W": "w", "A": "a"})
pod = k8s_utils.parse_accelerator("gpu-l4", spot="false")
print(json.dumps({"spot_selector": pod["node_selector"].get("cloud.google.com/gke-spot"),
                  "captured": sorted(core._capture_env("WANDB_API_KEY"))}))
"""


def test_keras_kinetic_takes_these_values_silently_and_we_refuse_them():
    """keras-kinetic 0.0.4 turns Spot on for spot="false" and reads capture_env_vars="WANDB_API_KEY"
    letter by letter (capturing W, A, ...); both are refused here at DAG import."""
    import json
    import os
    import subprocess

    from test_accelerator_parity import KINETIC_VERSION, ORACLE_PYTHON

    from kinetic_airflow import kinetic_task
    from kinetic_airflow.options import KineticOptionError

    if not ORACLE_PYTHON.exists():
        pytest.fail(
            f"keras-kinetic {KINETIC_VERSION} venv missing: {ORACLE_PYTHON} does not exist. "
            "Run `bash scripts/setup-kinetic-oracle.sh` (scripts/test.sh does).",
            pytrace=False,
        )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    out = subprocess.run(
        [str(ORACLE_PYTHON), "-c", _KINETIC_PROBE], capture_output=True, text=True, check=True, env=env
    )
    kinetic = json.loads(out.stdout)
    assert kinetic["spot_selector"] == "true"  # kinetic: Spot on
    assert {"W", "A"} <= set(kinetic["captured"])  # kinetic: single letters captured
    with pytest.raises(KineticOptionError, match="write spot=False"):
        kinetic_task(accelerator="gpu-l4", spot="false")
    with pytest.raises(KineticOptionError, match=r"write capture_env_vars=\['WANDB_API_KEY'\]"):
        kinetic_task(capture_env_vars="WANDB_API_KEY")


# [kinetic] keys that are not settings: reported with the closest one ---------------------------
@pytest.fixture
def fresh_key_check(monkeypatch):
    """The unknown-key report runs once per process; each test here starts before it ran."""
    from kinetic_airflow import config

    monkeypatch.setattr(config, "_warned_unknown", False)
    for variable in [v for v in __import__("os").environ if v.startswith("AIRFLOW__KINETIC__")]:
        monkeypatch.delenv(variable)
    return config


def test_a_mistyped_environment_key_is_reported_with_the_closest_setting(
    fresh_key_check, monkeypatch, caplog
):
    monkeypatch.setenv("AIRFLOW__KINETIC__POLL_INTERVALL", "30")
    monkeypatch.setenv("AIRFLOW__KINETIC__BACKEND_CMD", "echo local")  # a known key's _CMD form: fine
    with caplog.at_level("WARNING", logger="kinetic_airflow.config"), pytest.warns(UserWarning) as warned:
        with_typo = fresh_key_check.resolve_setting("poll_interval")
    expected = (
        "AIRFLOW__KINETIC__POLL_INTERVALL: 'poll_intervall' is not a kinetic setting and is ignored; "
        "did you mean poll_interval (AIRFLOW__KINETIC__POLL_INTERVAL)?"
    )
    assert [str(w.message) for w in warned] == [expected]
    assert [r.getMessage() for r in caplog.records if r.name == "kinetic_airflow.config"] == [expected]
    monkeypatch.delenv("AIRFLOW__KINETIC__POLL_INTERVALL")
    assert fresh_key_check.resolve_setting("poll_interval") == with_typo != 30  # the typo changed nothing
    monkeypatch.setenv("AIRFLOW__KINETIC__POLL_INTERVALL", "30")
    fresh_key_check.resolve_setting("poll_interval")  # once per process, not once per setting read
    assert len([r for r in caplog.records if r.name == "kinetic_airflow.config"]) == 1


def test_a_mistyped_airflow_cfg_key_is_reported(fresh_key_check):
    import configparser

    from airflow.sdk.configuration import conf

    added_section = not configparser.ConfigParser.has_section(conf, "kinetic")
    if added_section:
        configparser.ConfigParser.add_section(conf, "kinetic")
    configparser.ConfigParser.set(conf, "kinetic", "heartbeat_secondz", "3")
    try:
        messages = fresh_key_check.unknown_settings()
    finally:
        configparser.ConfigParser.remove_option(conf, "kinetic", "heartbeat_secondz")
        if added_section:
            configparser.ConfigParser.remove_section(conf, "kinetic")
    assert messages == [
        "[kinetic] heartbeat_secondz in airflow.cfg: 'heartbeat_secondz' is not a kinetic setting and is "
        "ignored; did you mean heartbeat_seconds (AIRFLOW__KINETIC__HEARTBEAT_SECONDS)?"
    ]


def test_a_key_like_no_setting_points_at_the_list(fresh_key_check, monkeypatch):
    monkeypatch.setenv("AIRFLOW__KINETIC__ZZZ", "1")
    assert fresh_key_check.unknown_settings() == [
        "AIRFLOW__KINETIC__ZZZ: 'zzz' is not a kinetic setting and is ignored; the settings are listed "
        "by `airflow config list --section kinetic`."
    ]


def test_a_mistyped_key_is_a_warning_of_the_dag_file_at_import(fresh_key_check, monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW__KINETIC__POLL_INTERVALL", "30")
    path = _dag_file(tmp_path, "typo_key", "operator", "spot", "False")
    bag = DagBag(dag_folder=str(tmp_path))
    assert bag.import_errors == {} and "typo_key" in bag.dags
    warned = "\n".join(bag.captured_warnings.get(str(path), ()))
    assert "'poll_intervall' is not a kinetic setting" in warned, bag.captured_warnings
    assert "did you mean poll_interval (AIRFLOW__KINETIC__POLL_INTERVAL)?" in warned


# One reading of a boolean written as text ------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "flag"),
    [
        *[(w, True) for w in ("true", "True", " TRUE ", "t", "yes", "y", "on", "1")],
        *[(w, False) for w in ("false", "F", "no", "n", "off", "0", " Off")],
        *[(w, None) for w in ("", "maybe", "2", "truee", "none")],
        (True, True),
        (False, False),
    ],
)
def test_parse_bool_is_the_one_reading_of_a_boolean(text, flag):
    from kinetic_airflow.options import parse_bool

    assert parse_bool(text) is flag


def test_config_reads_the_same_words(monkeypatch):
    from kinetic_airflow.config import resolve_setting

    monkeypatch.delenv("AIRFLOW__KINETIC__USE_INTERNAL_IP", raising=False)
    for word, flag in (("on", True), ("n", False), ("YES", True)):
        monkeypatch.setenv("KINETIC_USE_INTERNAL_IP", word)
        assert resolve_setting("use_internal_ip") is flag


# The docs' reference, rendered from the table --------------------------------------------------
def test_the_reference_lists_every_option_and_setting_in_well_formed_tables():
    from kinetic_airflow.options import OPTIONS, reference_markdown

    text = reference_markdown()
    for name, spec in OPTIONS.items():
        assert f"| `{name}` |" in text, name
        if spec.config:
            assert f"`AIRFLOW__KINETIC__{name.upper()}`" in text, name
    for table in text.split("\n\n"):
        rows = [line for line in table.splitlines() if line.startswith("|")]
        cells = {len(re.split(r"(?<!\\)\|", row)) for row in rows}
        assert len(cells) <= 1, table  # every row has the header's number of cells
    assert "| `poll_interval` | `float \\| timedelta \\| None` | `None` (`[kinetic]`: `2`) |" in text
