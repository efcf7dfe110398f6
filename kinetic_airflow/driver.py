"""The job driver: one task instance's job through one worker run (submit, reattach, watch,
collect, stop), as the operator's Airflow face hands it over.

``KineticRunOperator`` keeps what Airflow sees (template fields, ``execute``,
``execute_complete``, ``on_kill``, links) and the description of the job its options make
(``_job_ref``); everything the job *is* while a worker runs — its record in
``task_state_store``, its key, the job the worker owns until a watcher holds it — lives here,
in one ``JobDriver`` per ``execute`` (or per resumed ``execute_complete``), the way
cncf-kubernetes' pod operator hands its pod to a pod manager.

The steps, in the order of a run, and who decides them (``kinetic_airflow.lifecycle``)::

    start     decide (a new job, submit, ship, reattach, collect) from the record
    submit    record, publish job.json, create, record created, then ship
    ship      upload the payload, record shipped
    watch     record waiting, then wait here (wait_before_defer) or defer to the trigger
    complete  the ending event: deliver the value, raise the job's error, or run the next
              attempt after a preemption
    stop      on_kill: the task was killed while the worker watched the job
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk.exceptions import AirflowTaskTimeout

from kinetic_airflow import lifecycle, result_cache
from kinetic_airflow.backends import BackendStatus, JobRef, JobState
from kinetic_airflow.backends.gke.console import is_gke_cluster, job_links
from kinetic_airflow.backends.registry import get_backend
from kinetic_airflow.config import KineticSettingError, resolve_setting
from kinetic_airflow.connections import storage_for
from kinetic_airflow.job.integrity import IntegrityError, new_key
from kinetic_airflow.job.layout import JobIdentity, JobLayout
from kinetic_airflow.job.states import EVENT_FAILED, EVENT_PREEMPTED, EVENT_SUCCESS, EVENT_TIMEOUT, Cause
from kinetic_airflow.job.storage import Storage, parse_json
from kinetic_airflow.ladder import LADDER_CAUSES
from kinetic_airflow.lifecycle import (
    Action,
    JobRecord,
    Phase,
    TryInfo,
    WorkerStep,
    decide,
    history_entry,
    integrity_of_job,
    load_record,
    recorded_jobs,
    save_record,
)
from kinetic_airflow.links import LINKS_XCOM_KEY
from kinetic_airflow.options import parse_bool
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
    PayloadParts,
    Target,
    publish_job,
    resolve_gcp_conn_id,
    ship_payload,
)
from kinetic_airflow.triggers import KineticJobTrigger
from kinetic_airflow.usage import USAGE_XCOM_KEY, attempt_usage, emit_metrics, totals
from kinetic_airflow.validation import callable_name
from kinetic_airflow.watch import JobEvent, JobEventError, JobWatcher, describe_failure

if TYPE_CHECKING:
    from kinetic_airflow.operators import KineticRunOperator

__all__ = ["JobDriver", "WaitSettings", "links_of", "min_deferral_seconds", "push_links"]

log = logging.getLogger(__name__)

# Airflow's own deferral timeout is a safety net behind the trigger's deadline, which
# stops the job first; the margin lets the trigger's timeout event win the race.
_DEFERRAL_TIMEOUT_MARGIN = timedelta(minutes=5)


class JobDriver:
    """The job of one task instance, driven for one ``execute`` (or ``execute_complete``).

    ``task`` is the operator: its options describe the job (``task._job_ref``), and its Airflow
    methods hand the wait over (``defer``) and report the ending (``execute_complete``, which a
    DAG author's subclass may extend). ``context`` is the task's Airflow context. The driver
    holds what the worker knows of the job while it runs: ``integrity`` (its key and payload
    digest, for a run without a ``task_state_store``) and ``active_job`` (the job ``stop`` must
    stop: set while the worker itself watches it).
    """

    def __init__(self, task: KineticRunOperator, context: Any) -> None:
        self.task = task
        # The job's links as this process knows them: Airflow asks for them when the task ends
        # (``links._KineticLink``), and an XCom lookup would log an error where there are none.
        task.kinetic_links = {}
        self.integrity: dict[str, Any] | None = None
        self.active_job: JobRef | None = None
        self.cache_keys: list[str] = []  # cache=True: the keys this run looked up
        # ... and the payload it prepared for the job's base URI: shipped as it is on a miss
        self.prepared: tuple[str, PayloadParts] | None = None
        self.result_sha256: str | None = None  # the digest of the result _outcome verified
        self.bind(context)

    def bind(self, context: Any) -> None:
        """Drive the job with ``context`` (``execute_complete`` may get another than ``execute``)."""
        self.context = context
        self.store = context.get("task_state_store")
        self.gcp_conn_id = resolve_gcp_conn_id(self.task.gcp_conn_id)

    @property
    def now(self) -> TryInfo:
        return TryInfo.of(self.context["ti"])

    def _storage(self, uri: str) -> Storage:
        return storage_for(uri, self.gcp_conn_id)

    # Start ------------------------------------------------------------------------------------
    def start(self, target: Target) -> Any:
        """Find or create this try's job (``lifecycle.decide``) and watch it; the task's value."""
        ti = self.context["ti"]
        now = self.now
        identity = JobIdentity(
            ti.dag_id,
            ti.run_id,
            ti.task_id,
            ti.map_index if ti.map_index is not None else -1,
            now.try_number,
            try_id=now.ti_id,
        )
        timeout = self.task.execution_timeout
        deadline = time.time() + timeout.total_seconds() if timeout else None
        if self.store is None:
            return self._start_without_store(identity, target, deadline)
        record = load_record(self.store)
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
            ref = self.task._job_ref(identity, target.backend, target.base_uri, target.spec)
            if getattr(self.task, "cache", False):
                hit, value = self._reuse(ref, deadline, record)
                if hit:
                    return value
            return self._run_job(ref, deadline, record, Action.NEW_JOB)
        assert job is not None and record is not None
        if decision.action is Action.COLLECT:
            return self._collect(job)
        return self._run_job(job, record.deadline, record, decision.action)

    def _start_without_store(self, identity: JobIdentity, target: Target, deadline: float | None) -> Any:
        """Without a state store the deterministic name is the only memory: look before creating."""
        log.warning("task_state_store is not available: crash recovery is limited to the job name")
        ref = self.task._job_ref(identity, target.backend, target.base_uri, target.spec)
        summary, status, _ = self._observe(ref)
        action = Action.NEW_JOB if summary is None and status.state is JobState.NOT_FOUND else Action.WATCH
        return self._run_job(ref, deadline, None, action)

    def _run_job(
        self, ref: JobRef, deadline: float | None, previous: JobRecord | None, action: Action
    ) -> Any:
        """Create (``NEW_JOB``/``SUBMIT``), ship (``SHIP``) or just take over (``WATCH``) a job, and
        watch it: in the worker, or by deferring to the trigger.

        Everything from the job's creation to the hand-off runs inside ``lifecycle.until_watched``,
        the one place that keeps a job from running unwatched: any error before a watcher holds
        the job cancels it (and records why) before the error propagates. The settings the watch
        needs are resolved before a new job is created, so a bad one creates nothing at all.
        """
        settings = None if action is not Action.NEW_JOB else wait_settings(self.task)
        with lifecycle.until_watched(
            ref, store=self.store, now=self.now, deadline=deadline, cancel=self._cancel_unwatched
        ) as guard:
            settings = settings or wait_settings(self.task)
            if action in (Action.NEW_JOB, Action.SUBMIT):
                ref = guard.job = self._stamped(ref)
                previous = self._submit(ref, deadline, previous, guard)
            elif action is Action.SHIP:
                previous = self._ship(ref, deadline, previous, guard)
            event = self._wait(ref, deadline, previous, settings, guard)
        return self.task.execute_complete(self.context, event)

    def _stamped(self, ref: JobRef) -> JobRef:
        """The reference as submitted: when (kept from a resumed submit) and the GCP connection."""
        if ref.submitted_at is None:
            ref = ref.replace(submitted_at=time.time())
        if self.gcp_conn_id:
            ref = ref.replace(gcp_conn_id=self.gcp_conn_id)
        return ref

    def _observe(self, ref: JobRef) -> tuple[dict[str, Any] | None, BackendStatus, bool]:
        """(result summary, backend status, cancelled on purpose) of a job."""
        storage = self._storage(ref.job_uri)
        uri = JobLayout(ref.job_uri).result_summary()
        text = storage.read_text_or_none(uri)
        summary = parse_json(text, uri) if text else None  # bounded: never RecursionError
        cancelled = storage.read_text_or_none(lifecycle.cancelled_marker(ref)) is not None
        return summary, get_backend(ref.backend).status(ref), cancelled

    def _collect(self, ref: JobRef) -> Any:
        """Report how an ended job ended (its result or its failure), running nothing."""
        event = asyncio.run(self._watcher(ref, None, wait_settings(self.task)).wait())
        return self.task.execute_complete(self.context, event)

    # Reuse (cache=True: kinetic_airflow.result_cache) -----------------------------------------
    def _reuse(self, ref: JobRef, deadline: float | None, record: JobRecord | None) -> tuple[bool, Any]:
        """``(True, value)`` when an earlier job's verified result is reused instead of ``ref``."""
        dag = self.context.get("dag")
        lookup = result_cache.Lookup(
            self.task,
            self.context,
            self.store,
            self._storage,
            self.now,
            dag_file=getattr(dag, "fileloc", None) if dag is not None else None,
            dags_folder=airflow_dags_folder(),
        )
        hit, value = lookup.reuse(ref, deadline, record)
        self.cache_keys = lookup.keys
        self.prepared = (ref.base_uri, lookup.parts) if lookup.parts is not None else None
        return hit, value

    def _remember(self, ref: JobRef, job_key: str | None) -> None:
        """cache=True: enter this job's delivered, verified result in the result cache."""
        if getattr(self.task, "cache", False) and self.result_sha256 and job_key:
            result_cache.remember(
                self.task, self.context, self.store, self._storage(ref.job_uri), ref, job_key,
                self.result_sha256, looked_up=self.cache_keys,
            )  # fmt: skip

    # Stop -------------------------------------------------------------------------------------
    def stop(self) -> None:
        """The task was killed (timeout, SIGTERM, a user's clear or mark) while it waited in the
        worker: stop the job it watched. A deferred task's trigger does the same there."""
        ref = self.active_job
        if ref is not None:
            log.warning("task killed while its kinetic job %s runs: stopping the job", ref.job_id)
            self._cancel(ref, by=lifecycle.ON_KILL_BY, reason=lifecycle.ON_KILL_REASON)

    def _cancel_unwatched(self, ref: JobRef, *, by: str, reason: str, cause: Cause) -> None:
        self.active_job = None  # stopped here: stop() need not stop it again
        self._cancel(ref, by=by, reason=reason, cause=cause)

    def _cancel(self, ref: JobRef, *, by: str, reason: str, cause: Cause = Cause.STOPPED) -> None:
        storage = self._storage(ref.job_uri)
        lifecycle.cancel_job(ref, storage, get_backend(ref.backend), by=by, reason=reason, cause=cause)

    # Submit and ship --------------------------------------------------------------------------
    def _record(
        self, phase: Phase, ref: JobRef, deadline: float | None, previous: JobRecord | None, **extra: Any
    ) -> JobRecord:
        """Move the job record to ``phase``; returns the record, for the next step's ``previous``."""
        return save_record(
            self.store, phase, job=ref, now=self.now, deadline=deadline, previous=previous, **extra
        )

    def _submit(
        self,
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
        self.integrity = integrity
        guard.step = WorkerStep.RECORDING
        record = self._record(Phase.RECORDED, ref, deadline, previous, integrity=integrity)
        # job.json (the jobs CLI, retention) and, in a kinetic bucket, kinetic's handle.json
        guard.step = WorkerStep.PUBLISHING
        publish_job(self._storage(ref.job_uri), ref, callable_name(self.task.python_callable))
        guard.step = WorkerStep.CREATING
        get_backend(ref.backend).submit(ref, job_key=integrity["key"])
        guard.step = WorkerStep.RECORDING_CREATED
        record = self._record(Phase.CREATED, ref, deadline, record)
        return self._ship(ref, deadline, record, guard)

    def _ship(
        self,
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
        guard.step = WorkerStep.SHIPPING
        payload_bytes, output_dir, sha256 = self._ship_payload(ref, identity, integrity["key"])
        guard.step = WorkerStep.RECORDING_SHIPPED
        integrity = {**integrity, "payload_sha256": sha256}
        self.integrity = integrity
        record = self._record(Phase.SHIPPED, ref, deadline, previous, integrity=integrity)
        log.info(
            "submitted kinetic job %s (%s, %s, %d-byte payload); files at %s; KINETIC_OUTPUT_DIR=%s",
            ref.job_id,
            ref.backend,
            ref.accelerator or self.task.accelerator,  # a capacity ladder's rung names its own
            payload_bytes,
            ref.job_uri,
            output_dir,
        )
        return record

    def _integrity_of(self, record: JobRecord | None, ref: JobRef) -> dict[str, Any]:
        """The job's key and payload digest: from its record, or (no state store) this run's memory."""
        found = lifecycle.job_integrity(record, ref.job_id)
        return found or integrity_of_job(self.integrity, ref.job_id)

    def _ship_payload(self, ref: JobRef, identity: JobIdentity, key: str) -> tuple[int, str, str]:
        task = self.task
        dag = self.context.get("dag")
        return ship_payload(
            self._storage(ref.job_uri),
            ref,
            identity,
            python_callable=task.python_callable,
            op_args=task.op_args,
            op_kwargs=task.op_kwargs,
            volumes=task.volumes,
            capture_env_vars=task.capture_env_vars,
            output_dir=task.output_dir,
            heartbeat_seconds=resolve_setting("heartbeat_seconds", task.heartbeat_seconds),
            dag_file=getattr(dag, "fileloc", None) if dag is not None else None,
            dags_folder=airflow_dags_folder(),
            task_id=task.task_id,
            key=key,
            parts=self._take_prepared(ref),
        )

    def _take_prepared(self, ref: JobRef) -> PayloadParts | None:
        """The payload the cache look-up prepared for this job's storage, once (later attempts
        prepare their own)."""
        prepared, self.prepared = self.prepared, None
        return prepared[1] if prepared is not None and prepared[0] == ref.base_uri else None

    # Watch ------------------------------------------------------------------------------------
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

    def _wait(
        self,
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
        guard.step = WorkerStep.RECORDING_WAITING
        self._record(Phase.WAITING, ref, deadline, previous)
        guard.step = WorkerStep.PUSHING_LINKS
        self._push_links(ref)
        self.active_job = ref
        deferrable = self.task.deferrable
        if not deferrable or settings.wait_before_defer > 0:
            guard.step = WorkerStep.STARTING_WATCH
            watcher = self._watcher(ref, deadline, settings)
            guard.step = WorkerStep.WATCHING
            guard.on_kill_follows = (AirflowTaskTimeout,)  # Airflow calls on_kill after its timeout
            give_up_after = settings.wait_before_defer if deferrable else None
            event = asyncio.run(watcher.wait(give_up_after=give_up_after))
            guard.on_kill_follows = ()
            if event is not None:
                return event
        self.active_job = None  # from here on the trigger owns the wait (and its on_kill)
        timeout = None
        if deadline is not None:
            timeout = timedelta(seconds=max(0.0, deadline - time.time())) + _DEFERRAL_TIMEOUT_MARGIN
        guard.step = WorkerStep.BUILDING_TRIGGER
        trigger = KineticJobTrigger(
            job=ref.to_dict(),
            poll_interval=settings.poll_interval,
            deadline=deadline,
            gcp_conn_id=self.gcp_conn_id,
            log_max_lines=settings.log_max_lines,
            not_before=time.time() + settings.min_deferral_seconds,
            deferred_by=_deferring_process() if settings.watch_deferring_process else None,
            resume_margin=settings.resume_margin_seconds,
            storage_retry_seconds=settings.storage_retry_seconds,
        )
        guard.step = WorkerStep.DEFERRING
        self.task.defer(trigger=trigger, method_name="execute_complete", timeout=timeout)
        raise AssertionError("defer() returned instead of raising TaskDeferred")  # pragma: no cover

    def _push_links(self, ref: JobRef) -> None:
        self.task.kinetic_links = push_links(self.context["ti"], ref)

    # Complete ---------------------------------------------------------------------------------
    def complete(self, event: dict[str, Any] | None) -> Any:
        """The task's value from the job's ending event, or the error that says why there is none."""
        try:
            ended = JobEvent.from_dict(event)  # the event's one decoder
        except JobEventError as exc:
            raise KineticJobError(str(exc)) from None
        self.active_job = None
        record = lifecycle.load_record(self.store)
        ref = ended.job
        if record is not None and record.job.job_id == ref.job_id:
            ref = record.job  # the full reference: an event names its job briefly
        self.task.kinetic_links = links_of(ref)
        key = self._integrity_of(record, ref).get("key")
        status = ended.status
        if status == EVENT_PREEMPTED:
            return self._resubmit_after_preemption(ended, record, ref)
        if status == EVENT_FAILED and ended.cause in LADDER_CAUSES and ref.rung:
            if int(ref.rung["rung"]) < int(ref.rung["of"]):
                return self._next_rung(ended, record, ref)
            self._delivered(ref, "failed", record)
            raise KineticJobError(
                describe_failure(ended)
                + f"\nThe capacity ladder is used up: its last rung ({ref.rung['rung']} of {ref.rung['of']}) "
                "did not start either (the task log names each rung and why it was withdrawn). Add a "
                "rung, give the rungs longer to start, or retry later."
            )
        if status != EVENT_SUCCESS:
            # Recorded (and its usage line logged) first: the job's traceback, which
            # _raise_failure logs, is then the last thing above the task's error.
            self._delivered(ref, "timeout" if status == EVENT_TIMEOUT else "failed", record)
            self._raise_failure(ref, ended, key)
        try:
            value = self._outcome(ref, ended, key)
        except BaseException:
            self._delivered(ref, "failed", record)
            raise
        self._delivered(ref, "success", record)
        self._publish_metrics(ref, record)
        self._remember(ref, key)
        return value

    def _publish_metrics(self, ref: JobRef, record: JobRecord | None) -> None:
        """What the function reported (``kinetic_airflow.report``): XCom ``kinetic_metrics``, gauges
        and the outlets' Asset-event extra (``kinetic_airflow.reported_metrics``)."""
        try:
            try_number = ref.job_identity.try_number
            jobs = [j for j in (recorded_jobs(record) if record else []) if j.try_number == try_number]
            entries = [j.to_dict() for j in jobs or [history_entry(ref)]]
            attempts = read_attempts(entries, self._storage, summary_only=True)
            tags = gauge_tags(self.context["ti"], ref)
            publish(self.context, list(getattr(self.task, "outlets", None) or []), attempts, tags)
        except Exception as exc:  # the job succeeded: its metrics must not fail the task
            log.warning("could not publish the metrics of job %s: %s", ref.job_id, exc)

    def _delivered(self, ref: JobRef, outcome: str, record: JobRecord | None) -> None:
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
            usage = self._account(ref, outcome)
            deadline = record.deadline if record else None
            record = self._record(Phase.DELIVERED, ref, deadline, record, outcome=outcome, usage=usage)
            self._push_usage(record, usage)
        except Exception as exc:  # bookkeeping must never hide the job's own outcome
            log.warning("could not record the outcome of job %s: %s", ref.job_id, exc)

    def _account(self, ref: JobRef, outcome: str) -> dict[str, Any]:
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
        ti = self.context["ti"]
        emit_metrics(usage, ti.dag_id, ti.task_id)
        return usage

    def _push_usage(self, record: JobRecord, usage: dict[str, Any]) -> None:
        """XCom ``kinetic_usage``: this try's attempts (preemptions included) and their sums."""
        attempts = [
            j.usage for j in record.jobs or () if j.usage and j.usage.get("try_number") == usage["try_number"]
        ]
        self.context["ti"].xcom_push(key=USAGE_XCOM_KEY, value=totals(attempts or [usage]))

    def _outcome(self, ref: JobRef, event: JobEvent, key: str | None = None) -> Any:
        """The job's value as XCom, or the exception that says why there is none."""
        if event.status != EVENT_SUCCESS:
            self._raise_failure(ref, event, key)
        storage = self._storage(ref.job_uri)
        result_uri = JobLayout(ref.job_uri).result()
        identity = ref.job_identity
        summary = self._summary(storage, ref, 0, {})
        envelope, sha256 = load_verified_envelope(storage, result_uri, summary, key, 0)
        self.result_sha256 = sha256
        # its timings are in the job's own "finished in" line, streamed above
        log.info("kinetic job %s succeeded on attempt %d", ref.job_id, identity.attempt)
        return to_xcom(
            envelope["value"],
            result_uri,
            multiple_outputs=bool(self.task.multiple_outputs),
            max_bytes=int(resolve_setting("xcom_max_bytes")),
            sha256=sha256,
        )

    def _raise_failure(self, ref: JobRef, event: JobEvent, key: str | None = None) -> NoReturn:
        """The exception that says why a job has no value."""
        storage = self._storage(ref.job_uri)
        # a multi-host job's failure is reported from the failing host's own envelope
        result_uri = JobLayout(ref.job_uri).result(event.host_index)
        # The job's log lines were streamed into this task log already: none is repeated here.
        try:
            full_log = get_backend(ref.backend).full_log_hint(ref)
        except Exception:  # an event's brief reference (no job record) may not name enough
            full_log = ""
        if event.status == EVENT_TIMEOUT:
            raise AirflowTaskTimeout(describe_failure(event, full_log))
        if event.summary is not None:
            # The event names the failure briefly; message and traceback come from result.json.
            brief = {**event.summary, "error_message": event.message}
            summary = self._summary(storage, ref, event.host_index, brief)
            self._log_other_hosts(storage, ref, event, summary)
            try:
                envelope, _ = load_verified_envelope(storage, result_uri, summary, key, event.host_index)
            except IntegrityError:
                raise  # a forged failure record is refused, not reported as the job's error
            except Exception as exc:  # user classes missing on the worker: keep the text
                log.warning("could not load the remote exception object: %s", exc)
                envelope = None
            raise_remote(envelope, summary, ref.job_id, where=event.where or "", logger=self.task.log)
        raise KineticJobError(describe_failure(event, full_log))

    def _log_other_hosts(
        self, storage: Storage, ref: JobRef, event: JobEvent, reported: dict[str, Any]
    ) -> None:
        """The tracebacks of the other hosts that failed, before the reported one's (the streamed
        log leaves every host's traceback out, saying it is logged here). A traceback already
        shown (every host ran the same code into the same error) is named, not shown again."""
        hosts = int(ref.hosts or 1)
        shown = {reported.get("traceback")}
        same: list[str] = []
        for host in event.other_failed_hosts or []:
            summary = self._summary(storage, ref, int(host), {"error_message": ""})
            if summary.get("traceback") and summary["traceback"] in shown:
                same.append(str(host))
                continue
            shown.add(summary.get("traceback"))
            log_remote_traceback(summary, ref.job_id, f"host {host} of {hosts}", self.task.log)
        if same:
            self.task.log.error(
                "[kinetic] job %s: host(s) %s of %d failed with the same traceback as another host; "
                "it is shown once",
                ref.job_id,
                ", ".join(same),
                hosts,
            )

    def _summary(self, storage: Storage, ref: JobRef, host: int, brief: dict[str, Any]) -> dict[str, Any]:
        """The failing host's ``result.json``; ``brief`` (what the event says) if it cannot be read."""
        uri = JobLayout(ref.job_uri).result_summary(host)
        try:
            text = storage.read_text_or_none(uri)
            if text:
                return json.loads(text)
        except Exception as exc:  # the error itself must still be raised
            log.warning("could not read the result summary %s: %s", uri, exc)
        return brief

    def _resubmit_after_preemption(self, event: JobEvent, record: JobRecord | None, ref: JobRef) -> Any:
        """A preempted attempt runs again as a new attempt of the same try: no Airflow retry used.
        On a capacity ladder it starts again from the first rung (``rung_after_preemption``)."""
        identity = ref.job_identity
        limit = int(resolve_setting("preemption_retries", self.task.preemption_retries))
        preempted = identity.attempt - _withdrawn_attempts(record, identity.try_number)
        if preempted > limit:
            self._delivered(ref, "failed", record)
            raise KineticJobError(
                describe_failure(event)
                + f"\nThe job was preempted {preempted} times (preemption_retries={limit})."
            )
        deadline = record.deadline if record else None
        usage = self._account(ref, "preempted")
        if record is not None and record.job.job_id == ref.job_id:
            record = self._record(Phase.WAITING, ref, deadline, record, outcome="preempted", usage=usage)
        if ref.rung:  # a capacity ladder: the first rung again (Spot may be back), or the same one
            same = getattr(self.task, "rung_after_preemption", "first") == "same"
            index = int(ref.rung["rung"]) - 1 if same else 0
            new_ref = self.task._rung_job_ref(identity.next_attempt(), ref.base_uri, index)
        else:
            new_ref = self.task._job_ref(identity.next_attempt(), ref.backend, ref.base_uri, ref.spec)
        log.warning(
            "[kinetic] preempted -> attempt %d: job %s was preempted (%s); resubmitting "
            "(up to %d more) as %s. "
            "KINETIC_OUTPUT_DIR is unchanged, so checkpoints carry over; no Airflow retry is used.",
            identity.attempt + 1,
            ref.job_id,
            event.message,
            limit - identity.attempt,
            new_ref.job_id,
        )
        return self._run_job(new_ref, deadline, record, Action.NEW_JOB)

    def _next_rung(self, event: JobEvent, record: JobRecord | None, ref: JobRef) -> Any:
        """A capacity ladder's rung that did not start in its time (unschedulable, no scale-up,
        Kueue not admitting it, no provisioning: ``ladder.LADDER_CAUSES``) is withdrawn and the
        next rung is submitted as the next attempt of the same try: no Airflow retry is used.

        Withdrawn means its cluster objects are deleted (the watcher deleted them already when it
        gave the rung up; deleting again is a no-op that makes sure of it; Kueue's Workload and the
        job's Secret follow their owner); its payload, logs and storage stay, as for every job.
        """
        identity = ref.job_identity
        rung = ref.rung or {}
        get_backend(ref.backend).cancel(ref)
        deadline = record.deadline if record else None
        usage = self._account(ref, "withdrawn")
        if record is not None and record.job.job_id == ref.job_id:
            record = self._record(Phase.WAITING, ref, deadline, record, outcome="withdrawn", usage=usage)
        new_ref = self.task._rung_job_ref(identity.next_attempt(), ref.base_uri, int(rung["rung"]))
        log.warning(
            "[kinetic] capacity ladder: rung %d of %d (%s, %s) did not start (%s: %s); withdrawn, nothing "
            "of it is left in the cluster. Rung %d (%s, %s) is submitted as %s (attempt %d of this try; "
            "no Airflow retry is used).",
            rung["rung"],
            rung["of"],
            ref.accelerator,
            _capacity_of(ref),
            event.cause,
            event.message,
            int(rung["rung"]) + 1,
            new_ref.accelerator,
            _capacity_of(new_ref),
            new_ref.job_id,
            identity.attempt + 1,
        )
        return self._run_job(new_ref, deadline, record, Action.NEW_JOB)


def _capacity_of(ref: JobRef) -> str:
    """The capacity a job asked for, as the log names it."""
    capacity = ref.k8s.capacity if ref.k8s is not None else None
    if capacity:
        return capacity
    return "spot" if ref.spec is not None and ref.spec.spot else "on-demand"


def _withdrawn_attempts(record: JobRecord | None, try_number: int) -> int:
    """How many attempts of try ``try_number`` were a capacity ladder's withdrawn rungs (they are
    attempts, not preemptions: ``preemption_retries`` does not count them)."""
    if record is None:
        return 0
    return sum(1 for j in recorded_jobs(record) if j.try_number == try_number and j.outcome == "withdrawn")


def links_of(ref: JobRef) -> dict[str, str]:
    """GKE console and Cloud Logging URLs of a job on GKE; none for any other job."""
    cluster = ref.k8s.cluster if ref.k8s is not None else None
    if not cluster or not is_gke_cluster(cluster):
        return {}
    return job_links(
        project=cluster.get("project"),
        location=cluster.get("location") or "",
        cluster=cluster.get("name") or "",
        namespace=ref.on_cluster().namespace,
        job_name=get_backend(ref.backend).object_name(ref),
    )


def push_links(ti: Any, ref: JobRef) -> dict[str, str]:
    """Push a GKE job's links to XCom (``kinetic_airflow.links``: the UI reads them while the
    task is deferred); nothing for another job. Returns the links."""
    links = links_of(ref)
    if links:
        ti.xcom_push(key=LINKS_XCOM_KEY, value=links)
    return links


# Wait settings ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class WaitSettings:
    """How a job is watched (``wait_settings``)."""

    poll_interval: float
    log_max_lines: int
    wait_before_defer: float
    min_deferral_seconds: float
    resume_margin_seconds: float
    watch_deferring_process: bool
    storage_retry_seconds: float


def wait_settings(task: Any) -> WaitSettings:
    """The settings of the wait, checked: resolved before a job is created, so that a bad
    value fails the task with a message naming it, not after the job runs unwatched."""
    return WaitSettings(
        poll_interval=_number(
            "poll_interval", resolve_setting("poll_interval", task.poll_interval), task_arg=True
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


def _flag(value: Any) -> bool:
    """A boolean setting as the option table hands it over (checked there): a bool or its text."""
    return parse_bool(value) is True


def _deferring_process() -> dict[str, Any] | None:
    """This process (the one about to defer), as the trigger's kwargs carry it."""
    process = DeferringProcess.this_process()
    return process.to_dict() if process is not None else None


def min_deferral_seconds() -> float:
    """How long a deferred task's event is held back (see ``JobDriver._wait``)."""
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


def airflow_dags_folder() -> str | None:
    try:
        # Airflow start-up cost: loaded when called, not when this module is imported.
        from airflow.sdk.configuration import conf

        return conf.get("core", "dags_folder", fallback=None)
    except Exception:
        return None
