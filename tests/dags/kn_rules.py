"""DAGs for the tests of the real cluster rules (tests/test_cluster_rules.py): names as long as
Airflow allows, pods that admission refuses, a transient image pull failure, a watch RBAC denies."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import dag, task
from kn_test_util import record_failure

START = pendulum.datetime(2026, 1, 1, tz="UTC")
# 200 characters each: with kinetic's 15-character "keras-pathways-" prefix and the StatefulSet
# controller's revision hash, names derived from these must still fit 63 characters.
LONG_DAG_ID = ("a_research_team_s_nightly_multihost_pretraining_sweep_" + "x" * 200)[:200]
LONG_TASK_ID = ("train_the_global_mean_model_on_every_host_of_the_slice_" + "y" * 200)[:200]
assert len(LONG_DAG_ID) == len(LONG_TASK_ID) == 200


@task.kinetic(backend="pathways", accelerator="tpu-v6e-16", startup_timeout=120)
def every_host_reports() -> dict:
    return {"host": int(os.environ["KINETIC_HOST_INDEX"]), "hosts": int(os.environ["KINETIC_NUM_HOSTS"])}


@dag(dag_id=LONG_DAG_ID, schedule=None, start_date=START, catchup=False)
def kn_rules_long_names():
    every_host_reports.override(task_id=LONG_TASK_ID)()


@task.kinetic(backend="gke", namespace="no-sa", startup_timeout=3, on_failure_callback=record_failure)
def needs_service_account() -> int:
    return 1


@dag(schedule=None, start_date=START, catchup=False)
def kn_rules_missing_service_account():
    needs_service_account()


@task.kinetic(backend="gke", namespace="full-quota", startup_timeout=3, on_failure_callback=record_failure)
def over_quota() -> int:
    return 1


@dag(schedule=None, start_date=START, catchup=False)
def kn_rules_quota():
    over_quota()


@task.kinetic(backend="gke", namespace="restricted", startup_timeout=3, on_failure_callback=record_failure)
def not_restricted() -> int:
    return 1


@dag(schedule=None, start_date=START, catchup=False)
def kn_rules_pod_security():
    not_restricted()


@task.kinetic(
    backend="pathways",
    accelerator="tpu-v6e-16",
    namespace="no-sa",
    startup_timeout=3,
    on_failure_callback=record_failure,
)
def group_needs_service_account() -> int:
    return 1


@dag(schedule=None, start_date=START, catchup=False)
def kn_rules_group_missing_service_account():
    group_needs_service_account()


@task.kinetic(backend="gke", startup_timeout=120, on_failure_callback=record_failure)
def pulled_after_retries() -> str:
    return "pulled"


@dag(schedule=None, start_date=START, catchup=False)
def kn_rules_transient_pull():
    pulled_after_retries()


@task.kinetic(backend="gke", on_failure_callback=record_failure)
def watched_without_watch() -> int:
    import time

    time.sleep(30)  # the watcher must decide from the watch, not from a result already written
    return 1


@dag(schedule=None, start_date=START, catchup=False)
def kn_rules_watch_forbidden():
    watched_without_watch()


kn_rules_long_names()
kn_rules_missing_service_account()
kn_rules_quota()
kn_rules_pod_security()
kn_rules_group_missing_service_account()
kn_rules_transient_pull()
kn_rules_watch_forbidden()
