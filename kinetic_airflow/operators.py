"""KineticRunOperator: run a Python callable as a job on an accelerator (or locally).

The operator is the Airflow face: its options (template fields, checked by the option table)
describe the job (``_job_ref``); ``execute`` hands the job to a ``JobDriver``
(``kinetic_airflow.driver``), which finds or creates the one job of this task instance and
watches it or defers to ``KineticJobTrigger``; ``execute_complete`` has the driver turn the
result envelope into XCom or re-raise the remote exception; ``on_kill`` has it stop the job.

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

import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import BaseOperator

from kinetic_airflow.accelerators import AcceleratorSpec, parse_accelerator
from kinetic_airflow.backends import JobRef
from kinetic_airflow.backends.gke.client import gke_access, resolve_gke_cluster
from kinetic_airflow.backends.gke.image_choice import runner_image
from kinetic_airflow.backends.gke.images import check_image_python
from kinetic_airflow.backends.gke.pod_override import (
    PodOverrideError,
    combined_override,
    normalize_pod_override,
    validate_at_parse,
)
from kinetic_airflow.capacity import startup_timeout_for
from kinetic_airflow.config import DEFAULTS, local_state_root, resolve_setting
from kinetic_airflow.context_args import check_context_parameters
from kinetic_airflow.driver import JobDriver, airflow_dags_folder
from kinetic_airflow.job.debugging import debug_settings
from kinetic_airflow.job.inputs import data_in
from kinetic_airflow.job.layout import JobIdentity, JobLayout
from kinetic_airflow.job.ref import K8sFields
from kinetic_airflow.job.requirements import resolve_requirements
from kinetic_airflow.job.storage import uri_to_local_path
from kinetic_airflow.ladder import Rung, check_ladder_backend
from kinetic_airflow.links import (
    KineticJobConsoleLink,
    KineticJobLogsLink,
    KineticViewLink,
)
from kinetic_airflow.optional import require_airflow
from kinetic_airflow.options import (
    OPTIONS,
    is_deferred,
    task_option_names,
    task_parameters,
    templated_option_names,
    validate_options,
)
from kinetic_airflow.submission import (
    preflight,
    resolve_backend,
    resolve_base_uri,
    resolve_gcp_conn_id,
    resolve_placement,
    task_spec,
)
from kinetic_airflow.validation import (
    callable_name,
    check_backend_fits,
    ensure_name,
    validate_callable,
)

require_airflow()  # an older Airflow fails the DAG's import here, with the reason and the fix

if TYPE_CHECKING:
    from airflow.sdk import Context
    from typing_extensions import Unpack

    from kinetic_airflow.typed_args import OperatorOptions

__all__ = ["KineticRunOperator"]

log = logging.getLogger(__name__)


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
    # The links of this try's job as the worker knows them (set by JobDriver); None elsewhere.
    kinetic_links: dict[str, str] | None = None

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
        # A capacity ladder (a list of accelerators or capacities) leaves the first rung's values
        # as ``accelerator`` / ``capacity`` and every rung in ``ladder`` (kinetic_airflow.ladder).
        self.ladder: list[Rung] | None = None
        for name, value in check_task_options(values).items():
            setattr(self, name, value)
        self.capture_env_vars = self.capture_env_vars or []
        self.volumes = self.volumes or {}
        self.container_env = self.container_env or {}
        trial_accelerator = self.accelerator if not is_deferred(self.accelerator) else "cpu"
        self.pod_override = validate_at_parse(
            self.pod_override, trial_accelerator, self.spot, configured=resolve_setting("pod_override")
        )
        self.debug_settings = debug_settings(self.debug, self.debug_wait, self.debug_on_timeout)
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

    def _rung_job_ref(self, identity: JobIdentity, base_uri: str, index: int) -> JobRef:
        """The reference of a new job on rung ``index`` (0-based) of the task's capacity ladder:
        its accelerator parsed, and its backend resolved for it (a multi-host TPU rung runs as a
        LeaderWorkerSet on ``auto``); the job storage stays the task's, so the output directory
        (and its checkpoints) is the same on every rung."""
        ladder = self.ladder or [Rung(None, None)]
        rung = ladder[index]
        accelerator = rung.accelerator or self.accelerator
        spec = parse_accelerator(accelerator, spot=self.spot or None)
        backend = resolve_backend(self.backend, spec, slices=self.slices)
        check_ladder_backend(self.ladder, backend)
        return self._job_ref(identity, backend, base_uri, spec, rung=index)

    @contextmanager
    def _on_rung(self, rung: Rung) -> Iterator[None]:
        """The task as rung ``rung`` asks for it (its capacity and time to start), while one job's
        reference is built; the task's own values are back afterwards."""
        saved = {name: getattr(self, name) for name in ("capacity", "startup_timeout")}
        changes: dict[str, Any] = {}
        if rung.capacity is not None:
            changes["capacity"] = rung.capacity
        if rung.start_within is not None:
            changes["startup_timeout"] = rung.start_within
        try:
            for name, value in changes.items():
                object.__setattr__(self, name, value)  # not BaseOperator's template bookkeeping
            yield
        finally:
            for name, value in saved.items():
                object.__setattr__(self, name, value)

    def _job_ref(
        self,
        identity: JobIdentity,
        backend: str,
        base_uri: str,
        spec: AcceleratorSpec | None = None,
        *,
        rung: int = 0,
    ) -> JobRef:
        """The reference of a new job; ``spec`` is the accelerator preflight parsed (``Target``) or
        the previous attempt's, so the run parses it once (None: parsed here, as for a test).
        With a capacity ladder, the job of rung ``rung`` (``_rung_job_ref`` picks its spec)."""
        if not self.ladder:
            return self._new_job_ref(identity, backend, base_uri, spec)
        with self._on_rung(self.ladder[rung]):
            ref = self._new_job_ref(identity, backend, base_uri, spec)
        ref = ref.replace(rung=self.ladder[rung].to_dict(rung, len(self.ladder)))
        if ref.k8s is not None and ref.startup_timeout:
            # A rung's time to start bounds its wait in a Kueue queue too (Kueue not admitting it,
            # a ProvisioningRequest not provisioned): a queued rung must move on as well.
            queue = ref.k8s.queue_timeout
            bound = min(queue, ref.startup_timeout) if queue else ref.startup_timeout
            ref = ref.replace(k8s=dataclasses.replace(ref.k8s, queue_timeout=bound))
        return ref

    def _new_job_ref(
        self, identity: JobIdentity, backend: str, base_uri: str, spec: AcceleratorSpec | None = None
    ) -> JobRef:
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
        if self.debug_settings:  # kinetic_airflow.job.debugging
            ref = ref.replace(debug=self.debug_settings)
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
        folder = airflow_dags_folder()
        if fileloc and not os.path.isabs(fileloc) and folder:  # bundle-relative
            return os.path.join(folder, fileloc)
        return fileloc

    def _code_search_dirs(self) -> list[str]:
        """Where requirements are discovered: beside the DAG file, then the bundle root."""
        dag_file = self._dag_file()
        return [d for d in (dag_file and os.path.dirname(dag_file), airflow_dags_folder()) if d]

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
            startup_timeout=startup_timeout_for(
                placement,
                self.startup_timeout,
                resolve_setting("startup_timeout"),
                DEFAULTS["startup_timeout"],
            ),
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
        """Find or create this task instance's job and watch it (``kinetic_airflow.driver``)."""
        target = preflight(self, context)  # rendered values, context arguments: before any job exists
        return self._driver_for(context).start(target)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> Any:
        """The job's value from its ending event (the trigger's, or the in-worker wait's)."""
        return self._driver_for(context).complete(event)

    def on_kill(self) -> None:
        """The task was killed (timeout, SIGTERM, a user's clear or mark) while it waited in the worker.

        A deferred task has no worker process; its trigger's ``on_kill`` does the same there.
        """
        driver = getattr(self, "_driver", None)
        if driver is not None:
            driver.stop()

    def _driver_for(self, context: Context) -> JobDriver:
        """This task's job driver, for this context: one per operator, so that what it remembers
        of the job (its key, without a state store) reaches ``execute_complete`` in this process."""
        driver = getattr(self, "_driver", None)
        if driver is None:
            driver = self._driver = JobDriver(self, context)
        else:
            driver.bind(context)
        return driver


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


def _parse_time_backend(backend: str | None) -> str | None:
    try:
        return resolve_setting("backend", backend)
    except Exception:
        return backend
