"""What a function needs arrives with it: the DAG folder's code, its packages, its data.

On the local backend and on the cluster emulator (pods as processes), with dag.test(). The
package that requirements= installs is a wheel built here and served from a local
wheelhouse (PIP_FIND_LINKS, PIP_NO_INDEX), so no test needs the network.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest
from emulated_cluster import point_kinetic_at, running_emulator
from helpers import ti_states, xcom

pytestmark = pytest.mark.timeout(600)


def _wheel(folder: Path, name: str = "kn_tiny", version: str = "0.1", value: str = "tiny") -> Path:
    """A minimal pure-Python wheel, written by hand (no build tools, no network)."""
    dist = f"{name}-{version}"
    files = {
        f"{name}/__init__.py": f"VALUE = {value!r}\n".encode(),
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
        ).encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: kinetic-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


@pytest.fixture
def wheelhouse(tmp_path, monkeypatch):
    house = tmp_path / "wheelhouse"
    _wheel(house)
    monkeypatch.setenv("PIP_FIND_LINKS", str(house))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("UV_FIND_LINKS", str(house))
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("KINETIC_ENV_CACHE", str(tmp_path / "envs"))
    return house


@pytest.fixture(params=["local", "gke"])
def where(request, tmp_path, monkeypatch):
    """The local backend, or the GKE backend on the cluster emulator."""
    monkeypatch.setenv("KN_SHIP_BACKEND", request.param)
    if request.param == "gke":
        emulator = request.getfixturevalue("emulator_env")
    else:
        emulator = None
    import kn_ship

    importlib.reload(kn_ship)  # the DAGs read KN_SHIP_BACKEND when they are defined
    yield request.param, emulator


@pytest.fixture(scope="module")
def _cluster(tmp_path_factory):
    from cluster_emulator.nodes import NodePool

    # One node: the requirements cache is per node (a hostPath), so both jobs must share it.
    with running_emulator(tmp_path_factory, [NodePool("cpu", {})]) as running:
        yield running


@pytest.fixture
def emulator_env(_cluster, monkeypatch):
    point_kinetic_at(*_cluster, monkeypatch)
    return _cluster[0]


@pytest.fixture
def storage_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    return tmp_path / "kinetic"


def _run(name: str):
    import kn_ship

    return getattr(kn_ship, name)().test()


def _job_dirs(storage_dir: Path, task_id: str) -> list[Path]:
    return [
        p.parent
        for p in storage_dir.glob("jobs/*/manifest.json")
        if json.loads(p.read_text())["identity"]["task_id"] == task_id
    ]


def _summary(storage_dir: Path, task_id: str) -> dict:
    (found,) = _job_dirs(storage_dir, task_id)
    return json.loads((found / "result.json").read_text())


def test_a_dag_folder_package_imported_in_the_body_is_there(where, storage_dir):
    dr = _run("kn_ship_code")
    assert ti_states(dr) == {"uses_dag_folder_package": "success"}
    assert xcom(dr, "uses_dag_folder_package") == "hello from the DAG folder, job"


def test_a_helper_modules_frames_name_the_dag_folders_file(where, storage_dir):
    dr = _run("kn_ship_helper_fails")
    assert ti_states(dr) == {"helper_fails": "failed"}
    traceback = _summary(storage_dir, "helper_fails")["traceback"]
    helper = Path(__file__).parent / "dags" / "kn_shiplib" / "__init__.py"
    assert f'File "{helper}", line' in traceback, traceback
    assert "kinetic-job-" not in traceback  # not the job's temporary copy, deleted when it ends


def test_requirements_are_installed_once_per_machine(where, storage_dir, wheelhouse, capfd, caplog):
    caplog.set_level("INFO")
    dr = _run("kn_ship_requirements")
    out, err = capfd.readouterr()
    log = out + err + caplog.text  # the task log: lines the worker and the trigger logged
    assert ti_states(dr) == {"first": "success", "second": "success"}, log[-3000:]
    assert (xcom(dr, "first"), xcom(dr, "second")) == ("tiny-1", "tiny-2")
    assert ": installing kn-tiny==0.1 with " in log, log[-3000:]  # the first job, and only it:
    if where[0] == "local":  # (a cluster job's own log is its pod's)
        (second_dir,) = _job_dirs(storage_dir, "second")
        assert "installing" not in (second_dir / "job.log").read_text()
    assert "[install] Successfully installed kn-tiny-0.1" in log
    # On a cluster the cache is the node's hostPath (the emulator's stand-in folder for it): the
    # second pod found the first pod's environment there, and nothing was written at /kinetic.
    assert not Path("/kinetic").exists()
    assert "cached environment" in log and "nothing to install" in log
    first, second = _summary(storage_dir, "first"), _summary(storage_dir, "second")
    assert first["timings"]["install_cached"] == 0.0 and second["timings"]["install_cached"] == 1.0
    print(
        f"install step: first job {first['timings']['install_seconds']:.2f}s, "
        f"second job {second['timings']['install_seconds']:.3f}s ({where[0]})"
    )


def test_a_failed_install_is_its_own_phase_naming_the_package(where, storage_dir, wheelhouse, capfd):
    dr = _run("kn_ship_bad_requirements")
    out, err = capfd.readouterr()
    assert ti_states(dr) == {"needs_missing_package": "failed"}
    summary = _summary(storage_dir, "needs_missing_package")
    assert summary["phase"] == "install", summary
    assert "kn-does-not-exist==9.9" in summary["error_message"]
    assert "failed in phase 'install'" in out + err


def test_a_missing_module_names_where_it_ran_and_the_fix(where, storage_dir, capfd):
    dr = _run("kn_ship_absent_module")
    out, err = capfd.readouterr()
    assert ti_states(dr) == {"imports_absent_module": "failed"}
    log = out + err
    assert "ModuleNotFoundError" in log
    assert f"module 'kn_absent_module' is not installed in the {where[0]} job" in log, log[-3000:]
    assert "requirements=['kn_absent_module']" in log
    if where[0] == "gke":
        assert "on image kinetic-runner:test" in log


def test_the_code_archive_is_uploaded_once_for_many_jobs(where, storage_dir):
    dr = _run("kn_ship_many")
    assert ti_states(dr) == {f"shared_code[{i}]": "success" for i in range(3)}
    assert [xcom(dr, "shared_code", i) for i in range(3)] == [
        f"hello from the DAG folder, {i}" for i in (1, 2, 3)
    ]
    archives = list((storage_dir / "cache" / "code").glob("*.zip"))
    assert len(archives) == 1, archives
    manifests = [json.loads((d / "manifest.json").read_text()) for d in _job_dirs(storage_dir, "shared_code")]
    assert len(manifests) == 3 and {m["code"]["sha256"] for m in manifests} == {archives[0].stem}


def test_the_archive_leaves_out_what_it_should(tmp_path, caplog):
    from kinetic_airflow.job.codebundle import build_code_bundle, ship_code_bundle
    from kinetic_airflow.job.storage import open_storage

    root = tmp_path / "dags"
    for rel in ("dag.py", "lib/__init__.py", "lib/util.py", ".git/config", "lib/__pycache__/util.pyc",
                ".venv/pyvenv.cfg", "venv2/pyvenv.cfg", "venv2/lib.py", "node_modules/x.js",
                ".env", "keys/server.pem", "big/blob.bin", "notes.tmp", ".kineticignore",
                "airflow.db", "airflow.db-wal", "airflow.db-shm", "airflow.cfg"):  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    (root / ".kineticignore").write_text("# comments are fine\nbig/\n*.tmp\n")
    bundle = build_code_bundle([root])
    with zipfile.ZipFile(__import__("io").BytesIO(bundle.data)) as zf:
        names = sorted(zf.namelist())
    assert names == ["root0/dag.py", "root0/lib/__init__.py", "root0/lib/util.py"], names
    assert sorted(Path(p).name for p in bundle.left_out_secrets) == [".env", "server.pem"]
    assert build_code_bundle([root]).sha256 == bundle.sha256  # deterministic
    caplog.set_level("WARNING")
    ship_code_bundle(open_storage(f"file://{tmp_path}/store"), f"file://{tmp_path}/store", [root])
    assert "look like credentials" in caplog.text and ".env" in caplog.text


def test_requirements_are_discovered_beside_the_dag_file(tmp_path):
    from kinetic_airflow.job.requirements import resolve_requirements

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "requirements.txt").write_text("# pinned\nkn-tiny==0.1  # a comment\n\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "pyproject.toml").write_text(  # a DAG project: Airflow never goes into a job
        '[project]\nname = "x"\ndependencies = ["apache-airflow>=3.3", "apache-airflow-providers-google", '
        '"kn-tiny>=0.1"]\n'
    )
    assert resolve_requirements(None, [tmp_path / "a"]) == (
        ["kn-tiny==0.1"],
        str(tmp_path / "a" / "requirements.txt"),
    )
    assert resolve_requirements(None, [tmp_path / "b"])[0] == ["kn-tiny>=0.1"]
    assert resolve_requirements(["numpy", str(tmp_path / "a" / "requirements.txt")], [])[0] == [
        "numpy",
        "kn-tiny==0.1",
    ]
    with pytest.raises(FileNotFoundError, match="does not exist on the Airflow worker"):
        resolve_requirements(["missing-requirements.txt"], [])


def test_a_python_version_mismatch_is_refused_before_the_job_starts(emulator_env, storage_dir, monkeypatch):
    from kinetic_airflow.job.layout import JobIdentity
    from kinetic_airflow.operators import KineticRunOperator

    other = f"3.{sys.version_info[1] - 1}"
    monkeypatch.setenv("KINETIC_CONTAINER_IMAGE", f"us-docker.pkg.dev/p/kn-c/runner-cpu:py{other}")
    op = KineticRunOperator(task_id="mismatch", python_callable=print, backend="gke")
    before = emulator_env.request_log.count
    with pytest.raises(ValueError, match=rf"built for Python {other} but this Airflow worker runs Python 3"):
        op._job_ref(JobIdentity("d", "r", "mismatch"), "gke", os.environ["KINETIC_BASE_URI"])
    assert emulator_env.request_log.count == before  # nothing was created, nothing was even asked


def test_gs_data_with_fuse_is_mounted_through_the_csi_driver(emulator_env, storage_dir):
    from kinetic_airflow import Data
    from kinetic_airflow.backends.gke.backend import GKEBackend
    from kinetic_airflow.job.layout import JobIdentity, fuse_local_path, fuse_mount_path
    from kinetic_airflow.operators import KineticRunOperator

    data = Data("gs://kn-datasets/imagenet/train/", fuse=True)
    op = KineticRunOperator(
        task_id="fuse", python_callable=print, op_args=[data, Data("gs://kn-datasets/labels.csv", fuse=True)],
        backend="gke",
    )  # fmt: skip
    ref = op._job_ref(JobIdentity("d", "r-fuse", "fuse"), "gke", os.environ["KINETIC_BASE_URI"])
    manifest = GKEBackend().manifest(ref)
    template = manifest["spec"]["template"]
    assert template["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    attributes = sorted(
        (v["csi"]["driver"], v["csi"]["volumeAttributes"]["bucketName"], v["csi"]["volumeAttributes"]["mountOptions"])  # noqa: E501
        for v in volumes.values()
    )  # fmt: skip
    assert attributes == [
        ("gcsfuse.csi.storage.gke.io", "kn-datasets", "implicit-dirs"),  # labels.csv: its folder, the root
        ("gcsfuse.csi.storage.gke.io", "kn-datasets", "implicit-dirs,only-dir=imagenet/train"),
    ]
    mounts = {m["mountPath"] for m in template["spec"]["containers"][0]["volumeMounts"]}
    assert mounts == {
        fuse_mount_path("gs://kn-datasets/imagenet/train/"),
        fuse_mount_path("gs://kn-datasets/labels.csv"),
    }
    assert fuse_local_path("gs://kn-datasets/labels.csv").endswith("/labels.csv")
    GKEBackend().submit(ref)  # the emulator checks it against the Kubernetes schemas (strict)
    GKEBackend().cancel(ref)
