"""Issue 11, the everyday surface: context arguments, config, errors, the local backend's lane,
tracebacks. Real Airflow (dag.test(), the airflow CLI), the local backend, fake GCS where storage is
gs://. The typed API is in tests/test_typed_api.py; context arguments under the real scheduler in
tests/test_lifecycle_components.py."""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pendulum
import pytest
from helpers import on_storage, ti_states, xcom

from kinetic_airflow import Data, KineticRunOperator, kinetic_task

DAGS = Path(__file__).resolve().parent / "dags"


def _dag(name: str):
    import kn_everyday

    return kn_everyday.DAGS[name]


@pytest.fixture
def file_base_uri(tmp_path, monkeypatch) -> str:
    """Job storage on disk, for checks that run before storage is touched (one scheme is enough)."""
    uri = f"file://{tmp_path}/kinetic"
    monkeypatch.setenv("KINETIC_BASE_URI", uri)
    return uri


def _jobs(base_uri: str) -> list[str]:
    root = Path(base_uri[len("file://") :], "jobs")
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


# 1. Context arguments ----------------------------------------------------------------------------
@on_storage("gs")  # what reaches the function is the payload's, not the storage's
def test_context_arguments_reach_the_function(base_uri):
    day = pendulum.datetime(2026, 3, 4, 5, 6, tz="UTC")
    dr = _dag("kn_context").test(logical_date=day, run_conf={"epochs": 5})
    assert dr.state == "success", ti_states(dr)
    value = xcom(dr, "context_values")
    assert value["pid"] != os.getpid()  # computed in the job's process, from plain kwargs
    assert value["lr"] == 0.5
    assert value["ds"] == "2026-03-04"
    assert value["ds_nodash"] == "20260304"
    assert value["ts"] == day.isoformat()
    assert value["logical_date"] == day.isoformat()
    assert value["data_interval_start"] is not None and value["data_interval_end"] is not None
    assert value["run_id"] == dr.run_id == value["dag_run_id"]
    assert value["params"] == {"scale": 3, "epochs": 5}  # as for a plain @task: conf overrides params
    assert value["conf"] == {"epochs": 5}
    assert value["try_number"] == 1


@pytest.mark.parametrize(
    ("name", "hint"),
    [("ti", "use run_id, try_number"), ("dag", "pass what you need from the DAG"), ("var", "var.value")],
)
def test_live_context_objects_are_refused_at_parse_time(name, hint):
    namespace: dict = {}
    exec(f"def train(lr, {name}=None):\n    return lr\n", namespace)
    with pytest.raises(TypeError) as info:
        kinetic_task(namespace["train"])
    message = str(info.value)
    assert f"train() names the Airflow context value {name!r}" in message
    assert "cannot travel to a kinetic job" in message and hint in message
    assert "ds, ds_nodash" in message  # what it can name instead
    with pytest.raises(TypeError, match=f"names the Airflow context value {name!r}"):
        KineticRunOperator(task_id="t", python_callable=namespace["train"])


# 3. Config ---------------------------------------------------------------------------------------
def _airflow(home: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KINETIC_", "AIRFLOW__KINETIC__"))}
    env["AIRFLOW_HOME"] = str(home)  # a fresh home: its airflow.cfg is written from this provider's info
    airflow = str(Path(sys.executable).parent / "airflow")
    return subprocess.run([airflow, *args], capture_output=True, text=True, env=env, check=True).stdout


def test_airflow_config_shows_the_real_defaults(tmp_path):
    assert _airflow(tmp_path, "config", "get-value", "kinetic", "backend").strip() == "local"
    assert _airflow(tmp_path, "config", "get-value", "kinetic", "poll_interval").strip() == "2"
    listing = _airflow(tmp_path, "config", "list", "--section", "kinetic", "--show-values")
    for line in (
        "backend = local",
        "zone = us-central1-a",
        "cluster = kinetic-cluster",
        "namespace = default",
    ):
        assert line in listing
    for line in ("poll_interval = 2", "heartbeat_timeout = 300", "xcom_max_bytes = 262144"):
        assert line in listing


def test_declared_defaults_do_not_shadow_kinetic_env(monkeypatch):
    from kinetic_airflow.config import resolve_setting

    monkeypatch.setenv("KINETIC_HEARTBEAT_TIMEOUT", "12")
    assert resolve_setting("heartbeat_timeout") == 12.0
    monkeypatch.setenv("AIRFLOW__KINETIC__HEARTBEAT_TIMEOUT", "34")
    assert resolve_setting("heartbeat_timeout") == 34.0
    assert resolve_setting("heartbeat_timeout", 56.0) == 56.0


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("AIRFLOW__KINETIC__POLL_INTERVAL", "2s", "poll_interval takes a number of seconds, e.g. 2 or 0.5"),
        ("KINETIC_XCOM_MAX_BYTES", "1MB", "xcom_max_bytes takes a whole number, e.g. 262144"),
    ],
)
def test_a_value_that_does_not_parse_names_the_option_and_form(monkeypatch, variable, value, expected):
    from kinetic_airflow.config import resolve_setting

    monkeypatch.setenv(variable, value)
    key = variable.rsplit("__", 1)[-1].lower() if variable.startswith("AIRFLOW") else variable[8:].lower()
    with pytest.raises(ValueError) as info:
        resolve_setting(key)
    assert variable in str(info.value) and repr(value) in str(info.value) and expected in str(info.value)


# 4. Errors that name the problem and the fix -----------------------------------------------------
@pytest.fixture
def no_google_credentials(monkeypatch, tmp_path):
    """No GCP connection, no emulator, no ADC file, no metadata server (refused at once)."""
    for name in (
        "STORAGE_EMULATOR_HOST",
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_CLOUD_PROJECT",
        "GCLOUD_PROJECT",
        "CLOUDSDK_CORE_PROJECT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    monkeypatch.setenv("NO_GCE_CHECK", "True")


def test_gs_storage_without_any_credentials_says_how_to_get_them(no_google_credentials):
    from kinetic_airflow.connections import KineticConfigError, storage_for

    with pytest.raises(KineticConfigError) as info:
        storage_for("gs://my-bucket/kinetic").exists("gs://my-bucket/kinetic/x")
    message = str(info.value)
    assert "job storage gs://my-bucket/kinetic needs Google credentials, and there are none" in message
    assert "no Airflow connection 'google_cloud_default' and no ambient credentials" in message
    assert "airflow connections add google_cloud_default --conn-type google_cloud_platform" in message
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message and "base_uri='file:///path'" in message


def test_gke_without_a_connection_and_without_credentials_says_how(no_google_credentials):
    from kinetic_airflow.backends.gke.client import resolve_gke_cluster
    from kinetic_airflow.connections import KineticConfigError

    cluster = {"gcp_conn_id": None, "project": "p", "location": "us-central1-a", "name": "kinetic-cluster"}
    with pytest.raises(KineticConfigError) as info:
        resolve_gke_cluster(cluster)
    message = str(info.value)
    assert "the GKE backend needs Google credentials" in message
    assert "airflow connections add google_cloud_default" in message and "Workload Identity" in message


@pytest.fixture
def token_endpoint():
    """A local OAuth2 token endpoint: what a service account key's token_uri answers."""
    import http.server
    import threading

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
            body = json.dumps({"access_token": "ambient-token", "expires_in": 3600, "token_type": "Bearer"})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token", seen
    server.shutdown()


def test_gke_without_a_connection_uses_ambient_credentials(
    no_google_credentials, token_endpoint, tmp_path, monkeypatch
):
    """The README's promise: no google_cloud_default connection means the machine's own credentials
    (here a service account key in GOOGLE_APPLICATION_CREDENTIALS, its token from a local endpoint)."""
    from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from kinetic_airflow.backends.gke import client as gke_client
    from kinetic_airflow.backends.gke.client import api_server, resolve_gke_cluster

    token_uri, seen = token_endpoint
    ambient = "kinetic_ambient_google"  # kinetic_airflow.gcp_auth.AMBIENT_CONN_ID
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    key_file = tmp_path / "sa.json"
    key_file.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "ambient-project",
                "private_key_id": "1",
                "private_key": pem,
                "client_email": "worker@ambient-project.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": token_uri,
            }
        )
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    monkeypatch.delenv("AIRFLOW_CONN_KINETIC_AMBIENT_GOOGLE", raising=False)
    # The worker resolves the cluster through the GKE API. Nothing can stand in for Google's control
    # plane here, so only its one call is replaced: it records the credentials it was given.
    used = []

    def get_cluster(self, name, project_id):
        used.append((self.gcp_conn_id, self.get_credentials().service_account_email, name, project_id))
        return types.SimpleNamespace(
            endpoint="203.0.113.7", master_auth=types.SimpleNamespace(cluster_ca_certificate=ca)
        )

    ca = base64.b64encode(b"-").decode()
    monkeypatch.setattr(GKEHook, "get_cluster", get_cluster)
    monkeypatch.setattr(gke_client, "_ENDPOINTS", {})  # no earlier test's answer for this cluster
    cluster = resolve_gke_cluster(
        {"gcp_conn_id": None, "project": "p", "location": "us-central1-a", "name": "kinetic-cluster"}
    )
    assert used == [(ambient, "worker@ambient-project.iam.gserviceaccount.com", "kinetic-cluster", "p")]
    assert cluster["gcp_conn_id"] == ambient  # what the job reference (and the triggerer) gets
    # The worker and the triggerer build their Kubernetes client from that reference
    server = api_server(cluster)
    assert server.host == "https://203.0.113.7"
    assert server.headers()["Authorization"] == "Bearer ambient-token"  # minted from the ambient key
    assert len(seen) == 1 and "assertion=" in seen[0]  # the key's own JWT grant, no Airflow connection


def test_capture_env_vars_as_a_dict_is_refused_with_how_to_pass_values():
    with pytest.raises(TypeError) as info:
        kinetic_task(capture_env_vars={"WANDB_API_KEY": "abc"})
    message = str(info.value)
    assert "capture_env_vars takes the names of the Airflow worker's variables" in message
    assert "capture_env_vars=['WANDB_API_KEY']" in message
    assert "container_env={...}" in message and "Kubernetes Secret" in message
    assert "abc" not in message  # a value never goes into a message (it may be a secret)


def test_templated_accelerator_is_validated_after_rendering_before_a_job_exists(
    file_base_uri, tmp_path, monkeypatch
):
    monkeypatch.setenv("KN_TEST_FAILURES", str(tmp_path))
    dr = _dag("kn_templated_accelerator").test()
    assert ti_states(dr) == {"templated_accelerator": "failed"}
    kind, message = (tmp_path / "templated_accelerator.txt").read_text().split("\n", 1)
    assert kind.endswith("InvalidAcceleratorError")
    assert "tpu-v9z-8" in message
    assert _jobs(file_base_uri) == []  # nothing was created


def test_unsupported_base_uri_scheme_is_refused_at_parse_time():
    expected = "base_uri='s3://bucket/kinetic': kinetic job storage does not support the s3:// scheme"
    with pytest.raises(ValueError, match=expected) as info:
        kinetic_task(base_uri="s3://bucket/kinetic")
    assert "use gs://bucket/prefix" in str(info.value) and "file:///absolute/path" in str(info.value)
    with pytest.raises(ValueError, match=expected):
        KineticRunOperator(task_id="t", python_callable=print, base_uri="s3://bucket/kinetic")


@pytest.mark.parametrize(
    ("typed", "meant"), [("gcp", "gke"), ("gek", "gke"), ("lws", "pathways"), ("locl", "local")]
)
def test_unknown_backend_says_did_you_mean(typed, meant):
    with pytest.raises(ValueError, match=f"Did you mean backend='{meant}'"):
        kinetic_task(backend=typed)


# 5. The local backend stays in its lane ----------------------------------------------------------
def test_local_volume_mount_paths_are_refused(file_base_uri, tmp_path, monkeypatch):
    with pytest.raises(ValueError) as info:  # at parse time when the task says backend="local"
        kinetic_task(backend="local", volumes={"/data": Data("./ds")})
    message = str(info.value)
    assert "the local backend runs the job on this machine and never creates /data" in message
    assert "Pass the Data as an argument instead, train(data=Data('./ds'))" in message
    # and when the task runs, when local is the configured default
    monkeypatch.setenv("KN_TEST_FAILURES", str(tmp_path))
    dr = _dag("kn_local_volume").test()
    assert ti_states(dr) == {"with_volume": "failed"}
    assert "never creates /kinetic-test-volume" in (tmp_path / "with_volume.txt").read_text()
    assert not os.path.lexists("/kinetic-test-volume")
    assert _jobs(file_base_uri) == []


def test_tpu_accelerator_on_the_local_backend_warns_once(file_base_uri, caplog):
    from kinetic_airflow.submission import machine_has

    assert not machine_has("tpu")  # this test machine has none
    dr = _dag("kn_tpu_on_local").test()
    assert dr.state == "success", ti_states(dr)
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "kinetic_airflow.submission" and r.levelno >= logging.WARNING
    ]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "accelerator='tpu-v6e-8t' asks for TPU, but this task runs on the local backend and this "
        "machine has no TPU: the function runs on this machine's CPU."
    )


def test_relative_data_paths_resolve_against_the_dag_files_folder(base_uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the worker's cwd must not matter
    dr = _dag("kn_relative_data").test()
    assert dr.state == "success", ti_states(dr)
    assert xcom(dr, "relative_data") == ["lines.txt", "sub/inner.txt"]


def test_job_temp_dirs_are_removed_when_the_job_ends(file_base_uri, tmp_path, monkeypatch):
    record = tmp_path / "where.txt"
    monkeypatch.setenv("KN_TEST_RECORD", str(record))
    dr = _dag("kn_killed_hard").test()
    assert ti_states(dr) == {"killed_hard": "failed"}
    copy = Path(record.read_text())
    workdir = next(p for p in copy.parents if p.name.startswith("kinetic-job-"))
    assert not workdir.exists()  # the runner died with SIGKILL: its supervisor removed it
    (job,) = _jobs(file_base_uri)
    job_dir = Path(file_base_uri[len("file://") :], "jobs", job)
    assert (job_dir / "payload.pkl").exists() and (job_dir / "job.log").exists()  # what the user needs


# 6. Tracebacks -----------------------------------------------------------------------------------
@on_storage("file")  # the traceback is the result's, not the storage's
def test_remote_traceback_appears_once_with_the_dag_files_lines(base_uri, capfd):
    dr = _dag("kn_traceback").test()
    assert ti_states(dr) == {"diverges": "failed"}
    out, err = capfd.readouterr()
    log = out + err
    dag_file = str(DAGS / "kn_everyday.py")
    line = next(
        i
        for i, text in enumerate((DAGS / "kn_everyday.py").read_text().splitlines(), 1)
        if "KN-TRACEBACK-LINE" in text
    )
    assert "<dynamic-code>" not in log
    assert log.count(f'File "{dag_file}", line {line}, in check_loss') == 1
    assert log.count('raise ArithmeticError(f"loss is NaN after {loss!r}")') == 1
    assert log.count("ArithmeticError: loss is NaN after nan") == 2  # Airflow's error line + the remote one
    assert "[kinetic] (traceback left out here: it is logged at the end of the task, before its error)" in log


def test_a_job_that_dies_has_its_last_lines_once_and_an_error_that_points_at_them(file_base_uri, capfd):
    dr = _dag("kn_dies").test()
    assert ti_states(dr) == {"dies": "failed"}
    out, err = capfd.readouterr()
    log = out + err
    assert log.count("kn-dies: last words") == 1, log  # streamed, and not printed again
    assert "without writing a result envelope" in log, log
    assert "The job's last log lines are just above in this task log; the whole log: " in log, log
