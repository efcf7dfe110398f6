"""KineticRunOperator: run a Python callable as a job on an accelerator (or locally).

``execute`` finds or creates the one job of this task instance and defers to
``KineticJobTrigger``; ``execute_complete`` turns the result envelope into XCom
or re-raises the remote exception.

Exactly-once rests on the job record in ``task_state_store`` (written before the
job is created and after every step) and on job ids that are a function of the
task instance, its try (number and Airflow's per-try id) and the attempt. Why a
new try exists decides what it does (``kinetic_airflow.lifecycle.decide``): a
user's re-run (clear, backfill ``--reprocess-behavior``, a recreated DAG run)
stops the old job and runs a new one with the current code; an infrastructure
failure (worker crash, lost heartbeat, the executor-event race, a restart)
reattaches to the live job, returns the finished job's result, or replaces a job
that never got its payload; a retry after the function failed runs a new job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, cast

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowTaskTimeout

from kinetic_airflow import lifecycle
from kinetic_airflow.accelerators import AcceleratorSpec
from kinetic_airflow.backends import BackendStatus, JobRef, JobState
from kinetic_airflow.backends.gke.client import gke_access, resolve_gke_cluster
from kinetic_airflow.backends.gke.console import is_gke_cluster, job_links
from kinetic_airflow.backends.gke.image_choice import runner_image
from kinetic_airflow.backends.gke.images import check_image_python
from kinetic_airflow.backends.gke.pod_override import (
    PodOverrideError,
    combined_override,
    normalize_pod_override,
    validate_at_parse,
)
from kinetic_airflow.backends.registry import get_backend
from kinetic_airflow.config import KineticSettingError, local_state_root, resolve_setting
from kinetic_airflow.connections import storage_for
from kinetic_airflow.context_args import check_context_parameters
from kinetic_airflow.job.inputs import data_in
from kinetic_airflow.job.integrity import IntegrityError, new_key
from kinetic_airflow.job.layout import JobIdentity, JobLayout
from kinetic_airflow.job.ref import K8sFields
from kinetic_airflow.job.requirements import resolve_requirements
from kinetic_airflow.job.states import EVENT_PREEMPTED, EVENT_SUCCESS, EVENT_TIMEOUT
from kinetic_airflow.job.storage import Storage, parse_json, uri_to_local_path
from kinetic_airflow.lifecycle import (
    Action,
    JobRecord,
    Phase,
    TryInfo,
    decide,
    history_entry,
    integrity_of_job,
    load_record,
    recorded_jobs,
    save_record,
)
from kinetic_airflow.links import (
    LINKS_XCOM_KEY,
    KineticJobConsoleLink,
    KineticJobLogsLink,
    KineticViewLink,
)
from kinetic_airflow.optional import require_airflow
from kinetic_airflow.options import (
    OPTIONS,
    is_deferred,
    parse_bool,
    task_option_names,
    task_parameters,
    templated_option_names,
    validate_options,
)
from kinetic_airflow.reported_metrics import gauge_tags, publish, read_attempts
from kinetic_airflow.results import (
    KineticJobError,
    load_verified_envelope,
    log_remote_traceback,
    raise_remote,
    to_xcom,
)
from kinetic_airflow.resume_window import DeferringProcess
from kinetic_airflow.submission import (
    Target,
    preflight,
    publish_job,
    resolve_backend,
    resolve_base_uri,
    resolve_gcp_conn_id,
    resolve_placement,
    ship_payload,
    task_spec,
)
from kinetic_airflow.triggers import KineticJobTrigger
from kinetic_airflow.usage import USAGE_XCOM_KEY, attempt_usage, emit_metrics, totals
from kinetic_airflow.validation import (
    callable_name,
    check_backend_fits,
    ensure_name,
    validate_callable,
)
from kinetic_airflow.watch import JobWatcher, describe_failure

require_airflow()  # an older Airflow fails the DAG's import here, with the reason and the fix

if TYPE_CHECKING:
    from airflow.sdk import Context
    from typing_extensions import Unpack

    from kinetic_airflow.typed_args import OperatorOptions

__all__ = ["KineticRunOperator"]

log = logging.getLogger(__name__)

# Airflow's own deferral timeout is a safety net behind the trigger's deadline, which
# stops the job first; the margin lets the trigger's timeout event win the race.
_DEFERRAL_TIMEOUT_MARGIN = timedelta(minutes=5)


class KineticRunOperator(BaseOperator):
    """Run ``python_callable(*op_args, **op_kwargs)`` as a kinetic job and return its value.

    :param python_callable: any callable (function, lambda, ``functools.partial``, callable object).
    :param op_args: positional arguments (templated).
    :param op_kwargs: keyword arguments (templated).
    :param kwargs: the task options (``accelerator``, ``backend``, ``spot``, ...): the rows of
        ``kinetic_airflow.options`` (``reference_markdown()`` renders them for the docs), and
        BaseOperator's arguments. Every task option becomes an attribute of the same name holding
        its checked value (durations in seconds).

    Every option is checked when the operator is built (at DAG import), by its row in
    ``kinetic_airflow.options``; templated ones again once rendered, before any job exists.
    """

    template_fields: Sequence[str] = ("op_args", "op_kwargs", *templated_option_names())
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py"}
    ui_color = "#d7e9f7"
    operator_extra_links = (KineticViewLink(), KineticJobConsoleLink(), KineticJobLogsLink())
    shallow_copy_attrs: Sequence[str] = ("python_callable",)

    @task_parameters  # the options' names, types and defaults, where Airflow reads them
    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Unpack[OperatorOptions],
    ) -> None:
        given = cast("dict[str, Any]", kwargs)
        values = {name: given.pop(name, OPTIONS[name].parameter_default) for name in task_option_names()}
        super().__init__(**given)
        validate_callable(python_callable)
        check_context_parameters(python_callable, callable_name(python_callable))
        self.python_callable = ensure_name(python_callable)
        self.op_args = op_args if op_args is not None else []
        self.op_kwargs = op_kwargs if op_kwargs is not None else {}
        # One row of kinetic_airflow.options per option: a wrong value is a DAG import error
        # naming the option and the fix; durations become seconds, mappings and lists copies.
        for name, value in check_task_options(values).items():
            setattr(self, name, value)
        self.capture_env_vars = self.capture_env_vars or []
        self.volumes = self.volumes or {}
        self.container_env = self.container_env or {}
        trial_accelerator = self.accelerator if not is_deferred(self.accelerator) else "cpu"
        self.pod_override = validate_at_parse(
            self.pod_override, trial_accelerator, self.spot, configured=resolve_setting("pod_override")
        )
        if _parse_time_backend(self.backend) == "local":  # no cluster: no GKE console or Cloud Logging
            self.operator_extra_links = (KineticViewLink(),)

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:  # type: ignore[override]
        """As ``BaseOperator.partial``, with kinetic's default ``map_index_template`` (see
        ``kinetic_map_label``); Airflow labels mapped instances from the partial's template."""
        kwargs.setdefault("map_index_template", DEFAULT_MAP_INDEX_TEMPLATE)
        # A mapped operator is built when the task runs: check the options given here at parse
        # time (expanded ones are checked when each mapped instance is built, before it runs).
        check_task_options(kwargs)
        return super().partial(**kwargs)

    def kinetic_map_label(self) -> str:
        """The label of a mapped instance: the arguments ``.expand()`` gave it, ``name=value``.

        Used by the default ``map_index_template``; a DAG author's own template replaces it.
        Arguments given to ``.partial()`` are the same for every instance, so they are left out.
        """
        return map_label(self)

    # Settings ---------------------------------------------------------------------------------
    def _backend_name(self) -> str:
        return resolve_backend(self.backend, task_spec(self), slices=self.slices)

    def _base_uri(self, backend: str) -> str:
        return resolve_base_uri(self.base_uri, backend, self.project, self.cluster)

    def _gcp_conn_id(self) -> str | None:
        return resolve_gcp_conn_id(self.gcp_conn_id)

    def _storage(self, uri: str) -> Storage:
        return storage_for(uri, self._gcp_conn_id())

    def _job_ref(
        self, identity: JobIdentity, backend: str, base_uri: str, spec: AcceleratorSpec | None = None
    ) -> JobRef:
        """The reference of a new job; ``spec`` is the accelerator preflight parsed (``Target``) or
        the previous attempt's, so the run parses it once (None: parsed here, as for a test)."""
        spec = spec or task_spec(self)
        layout = JobLayout.for_job(base_uri, identity.job_id)
        if layout.job_uri.startswith("file://"):
            local_dir = uri_to_local_path(layout.job_uri)
        else:
            local_dir = os.path.join(local_state_root(), identity.job_id)
        ref = JobRef(
            backend=backend,
            job_id=identity.job_id,
            job_uri=layout.job_uri,
            base_uri=base_uri,
            identity=identity,
            local_dir=local_dir,
            python=resolve_setting("local_python") or sys.executable,
            stop_grace_seconds=float(resolve_setting("stop_grace_seconds", self.stop_grace_seconds)),
            # what the job's chips are counted from (usage), on the local backend too; its
            # ``accelerator`` is the spec's text
            spec=spec,
        )
        if backend != "local":
            ref = self._on_cluster(ref)
        lines, source = resolve_requirements(self.requirements, self._code_search_dirs())
        if lines:
            ref = ref.replace(requirements=lines, requirements_source=source)
        fuse = sorted(
            {d.source for d in data_in(self.op_args, self.op_kwargs, self.volumes) if d.fuse and d.is_remote}
        )
        if fuse and backend != "local":
            ref = ref.replace(fuse_data=fuse)
        return ref

    def _dag_file(self) -> str | None:
        try:
            fileloc = self.dag.fileloc if self.has_dag() else None
        except Exception:
            return None
        folder = _airflow_dags_folder()
        if fileloc and not os.path.isabs(fileloc) and folder:  # bundle-relative
            return os.path.join(folder, fileloc)
        return fileloc

    def _code_search_dirs(self) -> list[str]:
        """Where requirements are discovered: beside the DAG file, then the bundle root."""
        dag_file = self._dag_file()
        return [d for d in (dag_file and os.path.dirname(dag_file), _airflow_dags_folder()) if d]

    def _on_cluster(self, ref: JobRef) -> JobRef:
        """``ref`` with what a cluster backend needs; all of it public (ids, names, endpoint, CA)."""
        spec = ref.spec or task_spec(self)  # the spec ``_job_ref`` put there (parsed here for a test)
        check_backend_fits(ref.backend, spec)
        placement = resolve_placement(self, spec)
        if placement.capacity.model == "spot":  # capacity="spot" is the accelerator's ':spot'
            spec = spec.with_spot(True)
        queue_timeout = resolve_setting("queue_timeout", self.queue_timeout)
        cluster = resolve_gke_cluster(
            {
                "kubernetes_conn_id": resolve_setting("kubernetes_conn_id", self.kubernetes_conn_id),
                "gcp_conn_id": self._gcp_conn_id(),
                "project": resolve_setting("project", self.project),
                "location": resolve_setting("zone", self.zone),
                "name": resolve_setting("cluster", self.cluster),
                **gke_access(self.use_internal_ip, self.use_dns_endpoint, self.impersonation_chain),
            }
        )
        deadline = int(self.execution_timeout.total_seconds()) if self.execution_timeout else None
        image = runner_image(
            spec,
            self.container_image,
            resolve_setting("project", self.project),
            resolve_setting("zone", self.zone),
            resolve_setting("cluster", self.cluster),
        )
        check_image_python(image)
        return ref.replace(
            spec=spec,  # and its text as ``accelerator``
            hosts=spec.hosts * (self.slices or 1),  # every slice's hosts: one group
            startup_timeout=float(resolve_setting("startup_timeout", self.startup_timeout)),
            heartbeat_timeout=float(resolve_setting("heartbeat_timeout")),
            k8s=K8sFields(
                cluster=cluster,
                namespace=resolve_setting("namespace", self.namespace),
                node_selectors={**spec.node_selectors, **placement.node_selectors()},
                image=image,
                runner_python=resolve_setting("runner_python"),
                service_account=resolve_setting("service_account") or None,
                active_deadline_seconds=deadline,
                container_env=self.container_env,
                pod_override=combined_override(resolve_setting("pod_override"), self.pod_override),
                chips_per_host=spec.chips_per_host if spec.kind == "tpu" else None,
                capacity=placement.capacity.text if placement.capacity.model != "on-demand" else None,
                max_run_seconds=placement.max_run_seconds,
                local_queue=placement.local_queue,
                priority_class=placement.priority_class,
                queue_timeout=float(queue_timeout) if queue_timeout else None,
                slices=self.slices if (self.slices or 1) > 1 else None,
            ),
        )

    # Execute -----------------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        target = preflight(self, context)  # rendered values, context arguments: before any job exists
        ti = context["ti"]
        now = TryInfo.of(ti)
        backend_name, base_uri = target.backend, target.base_uri
        identity = JobIdentity(
            ti.dag_id,
            ti.run_id,
            ti.task_id,
            ti.map_index if ti.map_index is not None else -1,
            now.try_number,
            try_id=now.ti_id,
        )
        deadline = time.time() + self.execution_timeout.total_seconds() if self.execution_timeout else None
        store = context.get("task_state_store")
        if store is None:
            return self._execute_without_store(context, identity, target, deadline)
        record = load_record(store)
        decision = decide(record, now)
        if decision.observe and decision.job is not None:
            summary, status, cancelled = self._observe(decision.job)
            decision = lifecycle.after_observing(
                decision,
                finished_ok=bool(summary and summary.get("ok")),
                live=summary is None and status.state in (JobState.PENDING, JobState.RUNNING),
                cancelled=cancelled,
            )
        log.info("kinetic: %s", decision.reason)
        job = decision.job
        if decision.action is Action.NEW_JOB:
            if decision.replaces is not None:
                self._cancel(decision.replaces, by="a new try", reason=decision.reason)
            ref = self._job_ref(identity, backend_name, base_uri, target.spec)
            return self._run_job(context, ref, deadline, record, Action.NEW_JOB)
        assert job is not None and record is not None
        if decision.action is Action.COLLECT:
            return self._collect(context, job)
        return self._run_job(context, job, record.deadline, record, decision.action)

    def _execute_without_store(
        self, context: Context, identity: JobIdentity, target: Target, deadline: float | None
    ) -> Any:
        """Without a state store the deterministic name is the only memory: look before creating."""
        log.warning("task_state_store is not available: crash recovery is limited to the job name")
        ref = self._job_ref(identity, target.backend, target.base_uri, target.spec)
        summary, status, _ = self._observe(ref)
        action = Action.NEW_JOB if summary is None and status.state is JobState.NOT_FOUND else Action.WATCH
        return self._run_job(context, ref, deadline, None, action)

    def _run_job(
        self,
        context: Context,
        ref: JobRef,
        deadline: float | None,
        previous: JobRecord | None,
        action: Action,
    ) -> Any:
        """Create (``NEW_JOB``/``SUBMIT``), ship (``SHIP``) or just take over (``WATCH``) a job, and
        watch it: in the worker, or by deferring to the trigger.

        Everything from the job's creation to the hand-off runs inside ``lifecycle.until_watched``,
        the one place that keeps a job from running unwatched: any error before a watcher holds
        the job cancels it (and records why) before the error propagates. The settings the watch
        needs are resolved before a new job is created, so a bad one creates nothing at all.
        """
        settings = None if action is not Action.NEW_JOB else self._wait_settings()
        with lifecycle.until_watched(
            ref,
            store=context.get("task_state_store"),
            now=TryInfo.of(context["ti"]),
            deadline=deadline,
            cancel=self._cancel_unwatched,
        ) as guard:
            settings = settings or self._wait_settings()
            if action in (Action.NEW_JOB, Action.SUBMIT):
                ref = guard.job = self._stamped(ref)
                previous = self._submit(context, ref, deadline, previous, guard)
            elif action is Action.SHIP:
                previous = self._ship(context, ref, deadline, previous, guard)
            event = self._wait(context, ref, deadline, previous, settings, guard)
        return self.execute_complete(context, event)

    def _stamped(self, ref: JobRef) -> JobRef:
        """The reference as submitted: when (kept from a resumed submit) and the GCP connection."""
        if ref.submitted_at is None:
            ref = ref.replace(submitted_at=time.time())
        if self._gcp_conn_id():
            ref = ref.replace(gcp_conn_id=self._gcp_conn_id())
        return ref

    def _cancel_unwatched(self, ref: JobRef, *, by: str, reason: str) -> None:
        self._active_job = None  # stopped here: on_kill need not stop it again
        self._cancel(ref, by=by, reason=reason)

    def _observe(self, ref: JobRef) -> tuple[dict[str, Any] | None, BackendStatus, bool]:
        """(result summary, backend status, cancelled on purpose) of a job."""
        storage = self._storage(ref.job_uri)
        uri = JobLayout(ref.job_uri).result_summary()
        text = storage.read_text_or_none(uri)
        summary = parse_json(text, uri) if text else None  # bounded: never RecursionError
        cancelled = storage.read_text_or_none(lifecycle.cancelled_marker(ref)) is not None
        return summary, get_backend(ref.backend).status(ref), cancelled

    def _collect(self, context: Context, ref: JobRef) -> Any:
        """Report how an ended job ended (its result or its failure), running nothing."""
        event = asyncio.run(self._watcher(ref, None, self._wait_settings()).wait())
        return self.execute_complete(context, event)

    def _cancel(self, ref: JobRef, *, by: str, reason: str) -> None:
        lifecycle.cancel_job(ref, self._storage(ref.job_uri), get_backend(ref.backend), by=by, reason=reason)

    def on_kill(self) -> None:
        """The task was killed (timeout, SIGTERM, a user's clear or mark) while it waited in the worker.

        A deferred task has no worker process; its trigger's ``on_kill`` does the same there.
        """
        ref = getattr(self, "_active_job", None)
        if ref is not None:
            log.warning("task killed while its kinetic job %s runs: stopping the job", ref.job_id)
            self._cancel(ref, by=lifecycle.ON_KILL_BY, reason=lifecycle.ON_KILL_REASON)

    @staticmethod
    def _record(
        context: Context,
        phase: Phase,
        ref: JobRef,
        deadline: float | None,
        previous: JobRecord | None,
        **extra: Any,
    ) -> JobRecord:
        """Move the job record to ``phase``; returns the record, for the next step's ``previous``."""
        now = TryInfo.of(context["ti"])
        store = context.get("task_state_store")
        return save_record(store, phase, job=ref, now=now, deadline=deadline, previous=previous, **extra)

    def _submit(
        self,
        context: Context,
        ref: JobRef,
        deadline: float | None,
        previous: JobRecord | None,
        guard: lifecycle.UnwatchedJobGuard,
    ) -> JobRecord:
        """Record the job, create it, then ship the payload.

        Creating first lets the cluster's scheduling, node scale-up and image pull overlap the
        upload (the runner waits for the manifest). Each step is recorded before the next, so a
        crash anywhere leaves a record that says exactly what is left to do; an error stops the
        job (``guard``, see ``_run_job``).
        """
        # The job's key (kinetic_airflow.integrity): made here, kept in the record (metadata DB) and
        # handed to the job out of band; a resumed submit of the same job keeps the key it recorded.
        integrity = lifecycle.job_integrity(previous, ref.job_id) or {"job_id": ref.job_id, "key": new_key()}
        self._integrity = integrity
        guard.step = "recording the job"
        record = self._record(context, Phase.RECORDED, ref, deadline, previous, integrity=integrity)
        # job.json (the jobs CLI, retention) and, in a kinetic bucket, kinetic's handle.json
        guard.step = "publishing the job's description"
        publish_job(self._storage(ref.job_uri), ref, callable_name(self.python_callable))
        guard.step = "creating the job"
        get_backend(ref.backend).submit(ref, job_key=integrity["key"])
        guard.step = "recording the job as created"
        record = self._record(context, Phase.CREATED, ref, deadline, record)
        return self._ship(context, ref, deadline, record, guard)

    def _ship(
        self,
        context: Context,
        ref: JobRef,
        deadline: float | None,
        previous: JobRecord | None,
        guard: lifecycle.UnwatchedJobGuard,
    ) -> JobRecord:
        """Upload the payload of a created job (an error stops the job: ``guard``)."""
        identity = ref.job_identity
        integrity = self._integrity_of(previous, ref)
        if not integrity.get("key"):
            raise KineticJobError(
                f"job {ref.job_id} was created without a job key (by a kinetic-airflow that did not "
                "verify payloads), so its runner would refuse any payload: clear the task to run a new job"
            )
        guard.step = "shipping the payload"
        payload_bytes, output_dir, sha256 = self._ship_payload(context, ref, identity, integrity["key"])
        guard.step = "recording the job as shipped"
        integrity = {**integrity, "payload_sha256": sha256}
        self._integrity = integrity
        record = self._record(context, Phase.SHIPPED, ref, deadline, previous, integrity=integrity)
        log.info(
            "submitted kinetic job %s (%s, %s, %d-byte payload); files at %s; KINETIC_OUTPUT_DIR=%s",
            ref.job_id,
            ref.backend,
            self.accelerator,
            payload_bytes,
            ref.job_uri,
            output_dir,
        )
        return record

    def _integrity_of(self, record: JobRecord | None, ref: JobRef) -> dict[str, Any]:
        """The job's key and payload digest: from its record, or (no state store) this instance's memory."""
        found = lifecycle.job_integrity(record, ref.job_id)
        return found or integrity_of_job(getattr(self, "_integrity", None), ref.job_id)

    def _ship_payload(
        self, context: Context, ref: JobRef, identity: JobIdentity, key: str
    ) -> tuple[int, str, str]:
        dag = context.get("dag")
        return ship_payload(
            self._storage(ref.job_uri),
            ref,
            identity,
            python_callable=self.python_callable,
            op_args=self.op_args,
            op_kwargs=self.op_kwargs,
            volumes=self.volumes,
            capture_env_vars=self.capture_env_vars,
            output_dir=self.output_dir,
            heartbeat_seconds=resolve_setting("heartbeat_seconds", self.heartbeat_seconds),
            dag_file=getattr(dag, "fileloc", None) if dag is not None else None,
            dags_folder=_airflow_dags_folder(),
            task_id=self.task_id,
            key=key,
        )

    def _watcher(self, ref: JobRef, deadline: float | None, settings: WaitSettings) -> JobWatcher:
        return JobWatcher(
            ref,
            self._storage(ref.job_uri),
            get_backend(ref.backend),
            poll_interval=settings.poll_interval,
            deadline=deadline,
            log_max_lines=settings.log_max_lines,
            emit_log=lambda line: log.info("%s", line),  # a multi-host job's lines carry [hN]
            storage_retry_seconds=settings.storage_retry_seconds,
        )

    def _wait_settings(self) -> WaitSettings:
        """The settings of the wait, checked: resolved before a job is created, so that a bad
        value fails the task with a message naming it, not after the job runs unwatched."""
        return WaitSettings(
            poll_interval=_number(
                "poll_interval", resolve_setting("poll_interval", self.poll_interval), task_arg=True
            ),
            log_max_lines=int(_number("log_max_lines", resolve_setting("log_max_lines"), whole=True)),
            wait_before_defer=_number("wait_before_defer", resolve_setting("wait_before_defer"), zero=True),
            min_deferral_seconds=_number("min_deferral_seconds", min_deferral_seconds(), zero=True),
            resume_margin_seconds=_number(
                "resume_margin_seconds", resolve_setting("resume_margin_seconds"), zero=True
            ),
            watch_deferring_process=_flag(resolve_setting("watch_deferring_process")),
            storage_retry_seconds=_number(
                "storage_retry_seconds", resolve_setting("storage_retry_seconds"), zero=True
            ),
        )

    def _push_links(self, context: Context, ref: JobRef) -> None:
        """GKE console and Cloud Logging URLs, for a job on GKE only (``kinetic_airflow.links``)."""
        cluster = ref.k8s.cluster if ref.k8s is not None else None
        if not cluster or not is_gke_cluster(cluster):
            return
        links = job_links(
            project=cluster.get("project"),
            location=cluster.get("location") or "",
            cluster=cluster.get("name") or "",
            namespace=ref.on_cluster().namespace,
            job_name=get_backend(ref.backend).object_name(ref),
        )
        context["ti"].xcom_push(key=LINKS_XCOM_KEY, value=links)

    def _wait(
        self,
        context: Context,
        ref: JobRef,
        deadline: float | None,
        previous: Any,
        settings: WaitSettings,
        guard: lifecycle.UnwatchedJobGuard,
    ) -> dict[str, Any]:
        """Wait for the job: in the worker briefly (or wholly, if not deferrable), then deferred.

        Returns the job's ending event when the worker saw it, or raises ``TaskDeferred``. Short
        jobs are awaited here (``wait_before_defer``): one task process, no resume latency. The
        trigger is told which process deferred it, so it holds a finished job's event until that
        process's exit has reached the scheduler (``resume_window``): Airflow's executor-event race
        fails a task that resumes before.
        """
        guard.step = "recording the job as waiting"
        self._record(context, Phase.WAITING, ref, deadline, previous)
        guard.step = "pushing the job's links"
        self._push_links(context, ref)
        self._active_job = ref
        if not self.deferrable or settings.wait_before_defer > 0:
            guard.step = "starting to watch the job in the worker"
            watcher = self._watcher(ref, deadline, settings)
            guard.step = "watching the job in the worker"
            guard.on_kill_follows = (AirflowTaskTimeout,)  # Airflow calls on_kill after its timeout
            give_up_after = settings.wait_before_defer if self.deferrable else None
            event = asyncio.run(watcher.wait(give_up_after=give_up_after))
            guard.on_kill_follows = ()
            if event is not None:
                return event
        self._active_job = None  # from here on the trigger owns the wait (and its on_kill)
        timeout = None
        if deadline is not None:
            timeout = timedelta(seconds=max(0.0, deadline - time.time())) + _DEFERRAL_TIMEOUT_MARGIN
        guard.step = "building the trigger"
        trigger = KineticJobTrigger(
            job=ref.to_dict(),
            poll_interval=settings.poll_interval,
            deadline=deadline,
            gcp_conn_id=self._gcp_conn_id(),
            log_max_lines=settings.log_max_lines,
            not_before=time.time() + settings.min_deferral_seconds,
            deferred_by=_deferring_process() if settings.watch_deferring_process else None,
            resume_margin=settings.resume_margin_seconds,
            storage_retry_seconds=settings.storage_retry_seconds,
        )
        guard.step = "deferring to the triggerer"
        self.defer(trigger=trigger, method_name="execute_complete", timeout=timeout)
        raise AssertionError("defer() returned instead of raising TaskDeferred")  # pragma: no cover

    # Complete ----------------------------------------------------------------------------------
    def execute_complete(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> Any:
        if not event or "job" not in event:
            raise KineticJobError(f"the trigger returned no usable event: {event!r}")
        self._active_job = None
        record = lifecycle.load_record(context.get("task_state_store"))
        ref = JobRef.from_dict(event["job"])
        if record is not None and record.job.job_id == ref.job_id:
            ref = record.job  # the full reference: an event names its job briefly
        key = self._integrity_of(record, ref).get("key")
        status = event.get("status")
        if status == EVENT_PREEMPTED:
            return self._resubmit_after_preemption(context, event, record, ref)
        if status != EVENT_SUCCESS:
            # Recorded (and its usage line logged) first: the job's traceback, which
            # _raise_failure logs, is then the last thing above the task's error.
            self._delivered(context, ref, "timeout" if status == EVENT_TIMEOUT else "failed", record)
            self._raise_failure(ref, event, key)
        try:
            value = self._outcome(ref, event, key)
        except BaseException:
            self._delivered(context, ref, "failed", record)
            raise
        self._delivered(context, ref, "success", record)
        self._publish_metrics(context, ref, record)
        return value

    def _publish_metrics(self, context: Context, ref: JobRef, record: JobRecord | None) -> None:
        """What the function reported (``kinetic_airflow.report``): XCom ``kinetic_metrics``, gauges
        and the outlets' Asset-event extra (``kinetic_airflow.reported_metrics``)."""
        try:
            try_number = ref.job_identity.try_number
            jobs = [j for j in (recorded_jobs(record) if record else []) if j.get("try_number") == try_number]
            attempts = read_attempts(jobs or [history_entry(ref)], self._storage, summary_only=True)
            tags = gauge_tags(context["ti"], ref)
            publish(context, list(getattr(self, "outlets", None) or []), attempts, tags)
        except Exception as exc:  # the job succeeded: its metrics must not fail the task
            log.warning("could not publish the metrics of job %s: %s", ref.job_id, exc)

    def _delivered(self, context: Context, ref: JobRef, outcome: str, record: JobRecord | None) -> None:
        """Record that this job's outcome reached Airflow (unless a newer job owns the record),
        with what it cost (``kinetic_airflow.usage``)."""
        if record is not None and record.job.job_id != ref.job_id:
            log.warning(
                "not recording the outcome of job %s: the record now names job %s",
                ref.job_id,
                record.job.job_id,
            )
            return
        try:
            usage = self._account(context, ref, outcome)
            record = self._record(
                context,
                Phase.DELIVERED,
                ref,
                record.deadline if record else None,
                record,
                outcome=outcome,
                usage=usage,
            )
            self._push_usage(context, record, usage)
        except Exception as exc:  # bookkeeping must never hide the job's own outcome
            log.warning("could not record the outcome of job %s: %s", ref.job_id, exc)

    def _account(self, context: Context, ref: JobRef, outcome: str) -> dict[str, Any]:
        """One attempt's chip-hours: into usage.json, the task log and Airflow's metrics."""
        usage = attempt_usage(self._storage(ref.job_uri), ref, outcome)
        queue = usage["queue_seconds"]
        log.info(
            # run: the runner's start to its end, as its own "finished in" line counts it
            "[kinetic] attempt %d used %s: %.4f chip-hours (%d chips x %.1fs run, from the runner's start "
            "to its end; %s queue; %s)",
            usage["attempt"],
            usage["accelerator"],
            usage["chip_hours"],
            usage["chips"],
            usage["run_seconds"],
            f"{queue:.1f}s" if queue is not None else "no",
            "spot" if usage["spot"] else "on-demand",
        )
        emit_metrics(usage, context["ti"].dag_id, context["ti"].task_id)
        return usage

    @staticmethod
    def _push_usage(context: Context, record: JobRecord, usage: dict[str, Any]) -> None:
        """XCom ``kinetic_usage``: this try's attempts (preemptions included) and their sums."""
        attempts = [
            j["usage"]
            for j in record.jobs or ()
            if j.get("usage") and j["usage"].get("try_number") == usage["try_number"]
        ]
        context["ti"].xcom_push(key=USAGE_XCOM_KEY, value=totals(attempts or [usage]))

    def _outcome(self, ref: JobRef, event: dict[str, Any], key: str | None = None) -> Any:
        """The job's value as XCom, or the exception that says why there is none."""
        if event.get("status") != "success":
            self._raise_failure(ref, event, key)
        storage = self._storage(ref.job_uri)
        result_uri = JobLayout(ref.job_uri).result()
        identity = ref.job_identity
        summary = self._summary(storage, ref, 0, {"summary": {}, "message": ""})
        envelope, sha256 = load_verified_envelope(storage, result_uri, summary, key, 0)
        # its timings are in the job's own "finished in" line, streamed above
        log.info("kinetic job %s succeeded on attempt %d", ref.job_id, identity.attempt)
        return to_xcom(
            envelope["value"],
            result_uri,
            multiple_outputs=bool(self.multiple_outputs),
            max_bytes=int(resolve_setting("xcom_max_bytes")),
            sha256=sha256,
        )

    def _raise_failure(self, ref: JobRef, event: dict[str, Any], key: str | None = None) -> NoReturn:
        """The exception that says why a job has no value."""
        status = event.get("status")
        storage = self._storage(ref.job_uri)
        # a multi-host job's failure is reported from the failing host's own envelope
        result_uri = JobLayout(ref.job_uri).result(int(event.get("host") or 0))
        # The job's log lines were streamed into this task log already: none is repeated here.
        try:
            full_log = get_backend(ref.backend).full_log_hint(ref)
        except Exception:  # an event's brief reference (no job record) may not name enough
            full_log = ""
        if status == "timeout":
            raise AirflowTaskTimeout(describe_failure(event, full_log))
        if event.get("summary") is not None:
            # The event names the failure briefly; message and traceback come from result.json.
            summary = self._summary(storage, ref, int(event.get("host") or 0), event)
            self._log_other_hosts(storage, ref, event)
            try:
                envelope, _ = load_verified_envelope(
                    storage, result_uri, summary, key, int(event.get("host") or 0)
                )
            except IntegrityError:
                raise  # a forged failure record is refused, not reported as the job's error
            except Exception as exc:  # user classes missing on the worker: keep the text
                log.warning("could not load the remote exception object: %s", exc)
                envelope = None
            raise_remote(envelope, summary, ref.job_id, where=event.get("where") or "", logger=self.log)
        raise KineticJobError(describe_failure(event, full_log))

    def _log_other_hosts(self, storage: Storage, ref: JobRef, event: dict[str, Any]) -> None:
        """The tracebacks of the other hosts that failed, before the reported one's (the streamed
        log leaves every host's traceback out, saying it is logged here)."""
        hosts = int(ref.hosts or 1)
        for host in event.get("other_failed_hosts") or []:
            summary = self._summary(storage, ref, int(host), {"summary": {}, "message": ""})
            log_remote_traceback(summary, ref.job_id, f"host {host} of {hosts}", self.log)

    def _summary(self, storage: Storage, ref: JobRef, host: int, event: dict[str, Any]) -> dict[str, Any]:
        """The failing host's ``result.json``; the event's brief one if it cannot be read."""
        uri = JobLayout(ref.job_uri).result_summary(host)
        try:
            text = storage.read_text_or_none(uri)
            if text:
                return json.loads(text)
        except Exception as exc:  # the error itself must still be raised
            log.warning("could not read the result summary %s: %s", uri, exc)
        return {**event["summary"], "error_message": event.get("message")}

    def _resubmit_after_preemption(
        self, context: Context, event: dict[str, Any], record: JobRecord | None, ref: JobRef
    ) -> Any:
        """A preempted attempt runs again as a new attempt of the same try: no Airflow retry used."""
        identity = ref.job_identity
        limit = int(resolve_setting("preemption_retries", self.preemption_retries))
        if identity.attempt > limit:
            self._delivered(context, ref, "failed", record)
            raise KineticJobError(
                describe_failure(event)
                + f"\nThe job was preempted {identity.attempt} times (preemption_retries={limit})."
            )
        deadline = record.deadline if record else None
        usage = self._account(context, ref, "preempted")
        if record is not None and record.job.job_id == ref.job_id:
            record = self._record(
                context, Phase.WAITING, ref, deadline, record, outcome="preempted", usage=usage
            )
        new_ref = self._job_ref(identity.next_attempt(), ref.backend, ref.base_uri, ref.spec)
        log.warning(
            "[kinetic] preempted -> attempt %d: job %s was preempted (%s); resubmitting "
            "(up to %d more) as %s. "
            "KINETIC_OUTPUT_DIR is unchanged, so checkpoints carry over; no Airflow retry is used.",
            identity.attempt + 1,
            ref.job_id,
            event.get("message"),
            limit - identity.attempt,
            new_ref.job_id,
        )
        return self._run_job(context, new_ref, deadline, record, Action.NEW_JOB)


DEFAULT_MAP_INDEX_TEMPLATE = "{{ task.kinetic_map_label() }}"
_LABEL_VALUE_CHARS = 40
_LABEL_CHARS = 250  # Airflow's rendered_map_index column holds 250


def map_label(task: Any) -> str:
    """``lr=0.01, depth=4`` for the expanded arguments of a mapped task instance, "" otherwise.

    The DAG holds the mapped operator under the unmapped instance's task id; what it expanded
    are the keys of its expand input (``expand_kwargs`` gives a list: then every argument).
    """
    try:
        value = task.dag.task_dict[task.task_id]._get_specified_expand_input().value
    except Exception:
        return ""  # not mapped (or not in a DAG): Airflow shows no label
    expanded = list(value) if isinstance(value, dict) else None
    kwargs = getattr(task, "op_kwargs", {}) or {}
    names = [n for n in (expanded if expanded is not None else list(kwargs)) if n in kwargs]
    parts = [f"{n}={_short(kwargs[n])}" for n in names if n != "op_args"]
    if "op_args" in (expanded or []) or (not parts and getattr(task, "op_args", None)):
        parts.append(", ".join(_short(a) for a in task.op_args))
    label = ", ".join(parts)
    return label if len(label) <= _LABEL_CHARS else label[: _LABEL_CHARS - 1] + "…"


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _LABEL_VALUE_CHARS else text[: _LABEL_VALUE_CHARS - 1] + "…"


def _parse_time_backend(backend: str | None) -> str | None:
    try:
        return resolve_setting("backend", backend)
    except Exception:
        return backend


@dataclass(frozen=True)
class WaitSettings:
    """How a job is watched (``KineticRunOperator._wait_settings``)."""

    poll_interval: float
    log_max_lines: int
    wait_before_defer: float
    min_deferral_seconds: float
    resume_margin_seconds: float
    watch_deferring_process: bool
    storage_retry_seconds: float


def _number(
    name: str, value: Any, *, whole: bool = False, zero: bool = False, task_arg: bool = False
) -> float:
    """``value`` as a number for the setting ``name``, or an error that names it and the fix."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    valid = math.isfinite(number) and (number > 0 or (zero and number == 0))
    if not valid or (whole and number != int(number)):
        smallest = "0 or more" if zero else "more than 0"
        form = f"a whole number, {smallest}" if whole else f"a number of seconds, {smallest} (no unit)"
        where = f"[kinetic] {name} (AIRFLOW__KINETIC__{name.upper()}) or KINETIC_{name.upper()}"
        raise KineticSettingError(
            f"{name}={value!r} is not valid: {name} takes {form}, e.g. {name}={10000 if whole else 2}. "
            f"Set it {'on the task or ' if task_arg else ''}in {where}."
        )
    return number


def check_task_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """``validate_options`` (the option table's checks), and a pod override's shape checked by
    ``backends/gke/pod_override``, which knows a pod's fields and sits above the table."""
    checked = validate_options(values)
    override = checked.get("pod_override")
    if override is not None:
        try:
            checked["pod_override"] = normalize_pod_override(override)
        except PodOverrideError as exc:  # it names the field; add what a right one looks like
            example = OPTIONS["pod_override"].example
            raise PodOverrideError(f"{exc}. A pod override looks like {example}") from None
    return checked


def _flag(value: Any) -> bool:
    """A boolean setting as the option table hands it over (checked there): a bool or its text."""
    return parse_bool(value) is True


def _deferring_process() -> dict[str, Any] | None:
    """This process (the one about to defer), as the trigger's kwargs carry it."""
    process = DeferringProcess.this_process()
    return process.to_dict() if process is not None else None


def min_deferral_seconds() -> float:
    """How long a deferred task's event is held back (see ``KineticRunOperator._wait``)."""
    explicit = resolve_setting("min_deferral_seconds")
    if explicit is not None:
        return float(explicit)
    try:
        # Airflow start-up cost: loaded when called, not when this module is imported.
        from airflow.sdk.configuration import conf

        heartbeat = conf.getfloat("workers", "min_heartbeat_interval", fallback=5.0)
    except Exception:
        heartbeat = 5.0
    return 2 * heartbeat + 5.0


def _airflow_dags_folder() -> str | None:
    try:
        # Airflow start-up cost: loaded when called, not when this module is imported.
        from airflow.sdk.configuration import conf

        return conf.get("core", "dags_folder", fallback=None)
    except Exception:
        return None
