"""The product and the cluster emulator are separate distributions.

The product's wheel carries nothing of the emulator (no module, no vendored CRD), and the
emulator installed alone into a new virtualenv starts from its console script: it needs
nothing of kinetic-airflow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).with_name("uv")  # the test extra installs it beside this Python

pytestmark = pytest.mark.timeout(600)


def test_the_product_wheel_has_no_emulator_file(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("kinetic_airflow-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.startswith("kinetic_airflow/operators.py") for name in names)
    emulator = [n for n in names if "cluster_emulator" in n or "testing/cluster" in n or "crds/" in n]
    assert emulator == []
    assert not [n for n in names if n.endswith(".yaml") and "x-k8s.io" in n]


def test_the_emulator_alone_in_a_new_venv_starts(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(UV), "pip", "install", "--quiet", "--python", str(python), str(ROOT / "emulator")],
        check=True,
        capture_output=True,
        timeout=400,
    )
    probe = subprocess.run(
        [str(python), "-c", "import kinetic_airflow"],
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert probe.returncode != 0  # the product is not there, and the emulator did not need it
    kubeconfig = tmp_path / "kubeconfig"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [str(venv / "bin" / "kinetic-cluster-emulator"), "--port", "0", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,  # not the repository: nothing of it on sys.path
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY http://127.0.0.1:"), line + proc.stdout.read(2000)
        assert "server:" in kubeconfig.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
