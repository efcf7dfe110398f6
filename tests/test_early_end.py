"""A GKE job's result is delivered when its output closes, not when its Job's status catches up.

On a real node the kubelet notices a container's exit when it relists containers (once a
second), and the Job controller syncs the Job a second after its pod's update: the Job says
Complete a second or more after the process ended, while the pod's followed log ends at once.
The emulator delays exit reports that way (``delay_exit_reports``; here far longer than any
watcher needs, so the order of events cannot be a matter of timing): the trigger's event must
carry the function's result while the Job is still active, and a process that ends without a
result is still judged by its status, with its exit code.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import cloudpickle
import pytest
from emulated_cluster import point_kinetic_at, running_emulator
from jobkit import gke_job, key_of

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# Far longer than any watcher takes to read a summary: the order cannot depend on load.
REPORT_DELAY = 20.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_emulator(tmp_path_factory) as running:
        yield running


@pytest.fixture
def slow_reports(cluster, monkeypatch, tmp_path):
    emulator, kubeconfig = cluster
    point_kinetic_at(emulator, kubeconfig, monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}/kinetic")
    emulator.delay_exit_reports(REPORT_DELAY)
    yield emulator
    emulator.clear_faults()


def _first_event(ref) -> dict:
    from kinetic_airflow.triggers import KineticJobTrigger

    trigger = KineticJobTrigger(job=ref.to_dict(), poll_interval=0.3)

    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(first())


def _job(emulator, ref) -> dict:
    from kinetic_airflow.backends.gke.backend import k8s_job_name

    k8s = ref.on_cluster()
    found = emulator.get_object("jobs", k8s.namespace, k8s_job_name(ref))
    assert found is not None
    return found


def _conditions(job: dict) -> set[str]:
    return {c["type"] for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}


def _square(x: int) -> int:
    print(f"squaring {x}")
    return x * x


def _dies(code: int) -> None:
    print("about to die", flush=True)
    os._exit(code)


def test_the_result_is_delivered_before_the_job_says_complete(slow_reports):
    _, ref, storage = gke_job("early", _square, [7])
    event = _first_event(ref)
    assert event["status"] == "success", event
    # the event came from the stored result, long before the status could say anything
    assert not _conditions(_job(slow_reports, ref)) & {"Complete", "SuccessCriteriaMet", "Failed"}
    from kinetic_airflow.job.layout import JobLayout
    from kinetic_airflow.results import load_verified_envelope

    layout = JobLayout(ref.job_uri)
    summary = json.loads(storage.read_text(layout.result_summary()))
    envelope, _ = load_verified_envelope(storage, layout.result(), summary, key_of(ref.job_uri), 0)
    assert envelope["value"] == 49
    assert summary["ok"] and event["summary"]["ok"]


def test_a_process_that_ends_without_a_result_is_judged_by_its_status(slow_reports):
    """No summary when the output closes: the watcher waits for the Job's status (the delay),
    and the failure names the exit code as before."""
    slow_reports.delay_exit_reports(3.0)  # waited for in full here: shorter
    _, ref, _ = gke_job("dies", _dies, [3])
    event = _first_event(ref)
    assert event["status"] == "failed", event
    assert event["exit_code"] == 3, event
    assert "Failed" in _conditions(_job(slow_reports, ref))
