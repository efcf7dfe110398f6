"""``kinetic-airflow doctor``: check a cluster for what a first job needs, and say the fix for each miss.

A first job on a new cluster fails late and far away: a missing ``kinetic`` service account,
a Role without ``watch``, a TPU nobody provisioned, an image for another Python. Each shows
up minutes later, in a pod that never started or a trigger that waits. ``doctor`` asks the
cluster up front, with the same settings and the same identity the worker and triggerer use
(the task's options, ``[kinetic]``, ``KINETIC_*``), and prints one line per check with the
fix for each failure. ``run_doctor(...)`` is the same from Python.

What it checks, in order (a check that cannot run because an earlier one failed is skipped):

* settings: the accelerator string, and which backend runs it (Job or LeaderWorkerSet);
* cluster: reachable, through which endpoint (kubernetes connection, GKE public, private or
  DNS endpoint), and as whom (impersonation chain);
* permissions: a SelfSubjectAccessReview (authorization.k8s.io/v1) for every verb the
  backend uses in the namespace (``REQUIRED_RULES``; ``--print-rbac`` prints them as a Role);
  ``list``/``watch`` on events are checked too (the reason a pod cannot be created is read
  from them) but only warn: jobs run without them;
* namespace and service account present; the service account's Workload Identity
  annotation (``iam.gke.io/gcp-service-account``) when job storage is in GCS;
* job storage reachable from here (write, read, delete a probe object);
* for multi-host TPUs, the LeaderWorkerSet API and its version;
* nodes (or GKE node pools, node auto-provisioning, Autopilot) able to provide the accelerator;
* where jobs with ``requirements=`` cache their environments (``[kinetic] requirements_cache``):
  a hostPath folder of the node, or an emptyDir on GKE Autopilot, which refuses writable
  hostPath volumes (told by the GKE API's ``Cluster.autopilot.enabled``);
* with ``capacity="flex-start"`` and ``max_run_duration``: a node pool whose nodes carry
  ``cloud.google.com/gke-max-run-duration-seconds=<seconds>``, the label that duration puts in
  the pods' node selector, which only node pools the cluster autoscaler creates (node
  auto-provisioning, Autopilot) carry by themselves;
* the runner image's tag matching this Python (``check_image_python``).

A warning (the check could not tell, e.g. a namespaced Role may not list nodes; or what is
missing costs only diagnosis, e.g. no access to events) does not fail the run; a failure
does (exit code 1).
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kinetic_airflow.accelerators import LABEL_ACCELERATOR_COUNT, InvalidAcceleratorError, parse_accelerator
from kinetic_airflow.backends.gke.client import (
    ApiError,
    KubeApi,
    api_server,
    endpoint_mode,
    gke_access,
    resolve_gke_cluster_info,
)
from kinetic_airflow.backends.gke.image_choice import runner_image
from kinetic_airflow.backends.gke.images import check_image_python
from kinetic_airflow.backends.gke.volumes import (
    ENV_CACHE_HOST_PATH,
    RequirementsCacheError,
    requirements_cache_for,
)
from kinetic_airflow.capacity import LABEL_FLEX_START, LABEL_MAX_RUN, placement_of
from kinetic_airflow.config import default_base_uri, resolve_setting
from kinetic_airflow.connections import storage_for
from kinetic_airflow.validation import check_backend_fits

__all__ = [
    "REQUIRED_RULES",
    "WORKLOAD_IDENTITY_ANNOTATION",
    "Check",
    "DoctorReport",
    "rbac_yaml",
    "run_doctor",
]

WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"
LWS_GROUP = "leaderworkerset.x-k8s.io"

# (API group, resource, verbs, which backend needs it). What the backends call: create, get,
# watch and delete their Job / LeaderWorkerSet, list+watch it in the shared watch cache, read
# pods and their logs, read events (why a pod could not be created or scheduled), and create
# each job's key Secret (deleted with its owner by the garbage collector; by kinetic only when
# a stale one of the same name is in the way).
REQUIRED_RULES: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("batch", "jobs", ("create", "get", "list", "watch", "delete"), "gke"),
    (LWS_GROUP, "leaderworkersets", ("create", "get", "list", "watch", "delete"), "pathways"),
    ("", "pods", ("get", "list", "watch"), "all"),
    ("", "pods/log", ("get",), "all"),
    ("", "events", ("list", "watch"), "all"),
    # each job's key, in a Secret owned by its Job / LeaderWorkerSet (README, "Security model")
    ("", "secrets", ("create", "delete"), "all"),
)

OK, FAIL, WARN, SKIP = "ok", "fail", "warn", "skip"

# What a Role without list/watch on events costs (the FailedCreate reasons come from events).
_WITHOUT_EVENTS_LIST = (
    "Jobs still run, but kinetic cannot read the Job and StatefulSet controllers' FailedCreate "
    "events: a pod the cluster refuses to create (a ResourceQuota, a PodSecurity or webhook "
    "admission, a missing service account) then shows only as a job that did not start within "
    "startup_timeout, not with the controller's reason"
)
_WITHOUT_EVENTS_WATCH = (
    "Jobs still run, but the triggerer cannot follow the controllers' FailedCreate events: it "
    "relists them (every 15 s at most) instead, so the reason a pod cannot be created (a "
    "ResourceQuota, an admission, a missing service account) reaches the task late"
)


@dataclass
class Check:
    """One line of the report. ``fix`` says what to do when ``status`` is fail or warn."""

    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class DoctorReport:
    """All checks, in order; ``ok`` when none failed (warnings do not fail)."""

    settings: dict[str, Any]
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.status == FAIL for c in self.checks)

    def check(self, name: str) -> Check:
        """The check called ``name`` (tests and callers look one up)."""
        return next(c for c in self.checks if c.name == name)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "settings": self.settings, "checks": [asdict(c) for c in self.checks]}

    def render(self) -> str:
        marks = {OK: "ok  ", FAIL: "FAIL", WARN: "warn", SKIP: "skip"}
        lines = [f"kinetic-airflow doctor: {self.settings.get('accelerator')} on {self._where()}"]
        for c in self.checks:
            lines.append(f"[{marks[c.status]}] {c.name}: {c.detail}")
            if c.fix and c.status in (FAIL, WARN):
                lines.append(f"       fix: {c.fix}")
        failed = len(self.failures())
        lines.append(
            "all checks passed: a first job has what it needs"
            if not failed
            else f"{failed} check(s) failed; fix them and run kinetic-airflow doctor again"
        )
        return "\n".join(lines)

    def _where(self) -> str:
        s = self.settings
        target = s.get("kubernetes_conn_id") or f"GKE cluster {s.get('cluster')} ({s.get('project')})"
        return f"{target}, namespace {s.get('namespace')}"


# RBAC ---------------------------------------------------------------------------------------
def rbac_yaml(
    namespace: str = "default",
    subject: str = "AIRFLOW_SA@PROJECT.iam.gserviceaccount.com",
    name: str = "kinetic-airflow",
) -> str:
    """The minimum Role and RoleBinding for the identity the worker and triggerer act as.

    On GKE a Google service account is a Kubernetes ``User`` named by its email (with
    impersonation, the last account of the chain). Both backends' rules are in it, so one
    Role serves single-host Jobs and multi-host LeaderWorkerSets.
    """
    rules = []
    for group, resource, verbs, _ in REQUIRED_RULES:
        quoted = ", ".join('"' + verb + '"' for verb in verbs)
        rules.append(f'  - apiGroups: ["{group}"]\n    resources: ["{resource}"]\n    verbs: [{quoted}]')
    return (
        "apiVersion: rbac.authorization.k8s.io/v1\n"
        "kind: Role\n"
        "metadata:\n"
        f"  name: {name}\n"
        f"  namespace: {namespace}\n"
        "rules:\n" + "\n".join(rules) + "\n"
        "---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\n"
        "kind: RoleBinding\n"
        "metadata:\n"
        f"  name: {name}\n"
        f"  namespace: {namespace}\n"
        "roleRef:\n"
        "  apiGroup: rbac.authorization.k8s.io\n"
        "  kind: Role\n"
        f"  name: {name}\n"
        "subjects:\n"
        "  - apiGroup: rbac.authorization.k8s.io\n"
        "    kind: User\n"
        f"    name: {subject}\n"
    )


# The run ------------------------------------------------------------------------------------
def run_doctor(
    accelerator: str = "cpu",
    *,
    backend: str | None = None,
    namespace: str | None = None,
    service_account: str | None = None,
    kubernetes_conn_id: str | None = None,
    gcp_conn_id: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    cluster: str | None = None,
    use_internal_ip: bool | None = None,
    use_dns_endpoint: bool | None = None,
    impersonation_chain: str | list[str] | None = None,
    container_image: str | None = None,
    base_uri: str | None = None,
    capacity: str | None = None,
    max_run_duration: float | None = None,
    timeout: float = 10.0,
) -> DoctorReport:
    """Every check for a first job of ``accelerator``; arguments override ``[kinetic]`` as a task's do."""
    settings: dict[str, Any] = {
        "accelerator": accelerator,
        "backend": resolve_setting("backend", backend),
        "namespace": resolve_setting("namespace", namespace),
        "service_account": resolve_setting("service_account", service_account) or "default",
        "kubernetes_conn_id": resolve_setting("kubernetes_conn_id", kubernetes_conn_id),
        "gcp_conn_id": resolve_setting("gcp_conn_id", gcp_conn_id),
        "project": resolve_setting("project", project),
        "zone": resolve_setting("zone", zone),
        "cluster": resolve_setting("cluster", cluster),
        **gke_access(use_internal_ip, use_dns_endpoint, impersonation_chain),
        "container_image": container_image,  # runner_image() adds [kinetic] container_image(_KIND)
        "base_uri": resolve_setting("base_uri", base_uri),
        "capacity": resolve_setting("capacity", capacity),
        "max_run_duration": resolve_setting("max_run_duration", max_run_duration),
    }
    report = DoctorReport(settings)
    _Doctor(report, timeout).run()
    return report


class _Doctor:
    """The checks of one run; each adds its Check and returns what later checks need."""

    def __init__(self, report: DoctorReport, timeout: float) -> None:
        self.report = report
        self.s = report.settings
        self.timeout = timeout
        self.spec: Any = None
        self.cluster: dict[str, Any] | None = None
        self.gke_info: Any = None
        self.api: Any = None
        self.storage_handle: Any = None

    def add(self, name: str, status: str, detail: str, fix: str = "") -> Check:
        check = Check(name, status, detail, fix)
        self.report.checks.append(check)
        return check

    def run(self) -> None:
        if not self.settings():
            return
        reachable = self.reach()
        self.storage()
        self.image()
        later: list[tuple[str, Callable[[], None]]] = [
            ("permissions", self.permissions),
            ("namespace", self.namespace),
            ("service account", self.service_account),
            ("leaderworkerset api", self.leaderworkerset),
            ("accelerator nodes", self.nodes),
            ("requirements cache", self.requirements_cache),
        ]
        placement = placement_of(self.s.get("capacity"), self.s.get("max_run_duration"))
        if placement.capacity.model == "flex-start" and placement.max_run_seconds:
            later.append(("max run duration", lambda: self.max_run_duration(placement.max_run_seconds)))
        for name, check in later:
            if not reachable:
                self.add(name, SKIP, "not checked: the cluster is not reachable")
                continue
            try:
                check()
            except Exception as exc:  # an API error the check has no answer for: report, go on
                self.add(name, FAIL, f"could not check: {exc}", "see the error; then run doctor again")

    # settings ----------------------------------------------------------------------------
    def settings(self) -> bool:
        try:
            self.spec = parse_accelerator(self.s["accelerator"])
        except InvalidAcceleratorError as exc:
            self.add("settings", FAIL, str(exc), "pass an accelerator string: kinetic-airflow accelerators")
            return False
        wanted = "pathways" if self.spec.kind == "tpu" and self.spec.multi_host else "gke"
        configured = self.s["backend"]
        self.s["accelerator"] = self.spec.text
        if configured in ("gke", "pathways") and configured != wanted:
            try:
                check_backend_fits(configured, self.spec)
            except ValueError as exc:
                self.add("settings", FAIL, str(exc), f"set backend={wanted!r} or backend='auto'")
                return False
        backend = configured if configured in ("gke", "pathways") else wanted
        self.s["backend"] = backend
        kind = "a LeaderWorkerSet" if backend == "pathways" else "a batch/v1 Job"
        note = "" if configured == backend else f" (configured backend {configured!r}; checking {backend!r})"
        gke_only = [
            k for k in ("use_internal_ip", "use_dns_endpoint", "impersonation_chain") if self.s.get(k)
        ]
        if self.s.get("kubernetes_conn_id") and gke_only:
            self.add(
                "settings",
                WARN,
                f"{', '.join(gke_only)} set, but the cluster is reached through kubernetes connection "
                f"{self.s['kubernetes_conn_id']!r}, which they do not apply to",
                "unset kubernetes_conn_id to reach GKE through the GCP connection, or drop those options",
            )
            return True
        self.add(
            "settings", OK, f"{self.spec.text} runs as {kind} of {self.spec.hosts} host(s) on {backend}{note}"
        )
        return True

    # cluster -----------------------------------------------------------------------------
    def reach(self) -> bool:
        s = self.s
        ref = {
            "kubernetes_conn_id": s["kubernetes_conn_id"],
            "gcp_conn_id": s["gcp_conn_id"],
            "project": s["project"],
            "location": s["zone"],
            "name": s["cluster"],
            "use_internal_ip": s["use_internal_ip"],
            "use_dns_endpoint": s["use_dns_endpoint"],
            "impersonation_chain": s["impersonation_chain"],
        }
        mode = endpoint_mode(ref)
        if mode != "kubernetes_conn_id" and not s["project"]:
            self.add(
                "cluster",
                FAIL,
                "no cluster configured: neither a kubernetes connection nor a GCP project",
                "set [kinetic] project, zone and cluster (or KINETIC_PROJECT...) for GKE, or "
                "[kinetic] kubernetes_conn_id for another cluster; or pass --project / --kubernetes-conn-id",
            )
            return False
        try:
            if mode == "kubernetes_conn_id":
                self.cluster = ref
            else:
                self.cluster, self.gke_info = resolve_gke_cluster_info(ref)
            self.api = KubeApi(api_server(self.cluster), retries=0)
        except Exception as exc:
            self.add("cluster", FAIL, f"cannot resolve the cluster: {exc}", self._resolve_fix(exc, mode))
            return False
        where = self._where(mode)
        try:
            version = self.api.request("GET", "/version", timeout=(self.timeout, self.timeout), retry=False)
        except Exception as exc:  # ApiError, or TLS / DNS errors the client does not wrap
            self.add("cluster", FAIL, f"{where} did not answer: {exc}", self._reach_fix(exc, mode))
            return False
        who = ""
        if self.cluster.get("impersonation_chain"):
            who = f", as {self.cluster['impersonation_chain'][-1]} (impersonated)"
        self.add("cluster", OK, f"reached {where}: Kubernetes {version.get('gitVersion', '?')}{who}")
        return True

    def _where(self, mode: str) -> str:
        if mode == "kubernetes_conn_id":
            return f"the cluster of kubernetes connection {self.s['kubernetes_conn_id']!r}"
        names = {"public": "public endpoint", "private": "private endpoint", "dns": "DNS endpoint"}
        return f"GKE cluster {self.s['cluster']!r} on its {names[mode]} {self.cluster['endpoint']}"  # type: ignore[index]

    def _resolve_fix(self, exc: Exception, mode: str) -> str:
        text = str(exc)
        if mode == "kubernetes_conn_id":
            return (
                f"define the Airflow connection {self.s['kubernetes_conn_id']!r} (conn type kubernetes, "
                "with a kubeconfig or in-cluster config)"
            )
        if "403" in text or "PermissionDenied" in type(exc).__name__ or "permission" in text.lower():
            return (
                "grant the worker's and triggerer's identity container.clusters.get on the cluster "
                "(roles/container.clusterViewer), or impersonate an account that has it "
                "(impersonation_chain; the worker then needs roles/iam.serviceAccountTokenCreator on it)"
            )
        if "404" in text or "NotFound" in type(exc).__name__:
            return (
                "check project, zone (the cluster's location) and cluster: [kinetic] project, zone, cluster"
            )
        return "see the error; use_internal_ip / use_dns_endpoint choose the endpoint ([kinetic] or task)"

    def _reach_fix(self, exc: Exception, mode: str) -> str:
        status = getattr(exc, "status", None)
        if status in (401, 403):
            return (
                "the cluster refused the identity's token: on GKE grant it roles/container.clusterViewer "
                "(container.clusters.get) so it may authenticate, and apply the Role of "
                "kinetic-airflow doctor --print-rbac; check the connection's credentials"
            )
        if mode == "private":
            return (
                f"the private endpoint {self.cluster['endpoint']} is reachable only from the cluster's VPC "  # type: ignore[index]
                "(or a peered network, Cloud Composer 3's network attachment): run the worker and "
                "triggerer there, or set use_dns_endpoint=True ([kinetic] use_dns_endpoint) to reach the "
                "cluster's DNS endpoint from anywhere IAM allows"
            )
        if mode == "public":
            return (
                "the public endpoint refuses this machine: add its address to the cluster's authorized "
                "networks (gcloud container clusters update CLUSTER --master-authorized-networks ...), "
                "or use use_dns_endpoint=True / use_internal_ip=True when Airflow runs inside the VPC"
            )
        if mode == "dns":
            return (
                "the DNS endpoint did not answer: check the name resolves from here, that DNS access is "
                "enabled (gcloud container clusters update CLUSTER --enable-dns-access) and that the "
                "identity has container.clusters.connect"
            )
        return (
            f"check the server URL and credentials of connection {self.s['kubernetes_conn_id']!r} "
            "(kube_config / kube_config_path) and that this machine can reach it"
        )

    # permissions -------------------------------------------------------------------------
    def permissions(self) -> None:
        """A SelfSubjectAccessReview per verb. Any verb on the backend's objects, pods or logs
        missing fails; ``list``/``watch`` on events missing alone warns, saying what is lost:
        jobs run without it, but a pod the cluster refuses to create is no longer explained."""
        ns = self.s["namespace"]
        backend = self.s["backend"]
        denied: list[tuple[str, str]] = []
        for group, resource, verbs, needed_by in REQUIRED_RULES:
            if needed_by not in ("all", backend):
                continue
            for verb in verbs:
                answer = self._review(ns, group, resource, verb)
                if answer is None:
                    self.add(
                        "permissions",
                        WARN,
                        "could not ask the cluster (SelfSubjectAccessReview refused)",
                        f"check the Role by hand: kinetic-airflow doctor --print-rbac --namespace {ns}",
                    )
                    return
                if not answer:
                    denied.append((verb, resource))
        asked = ", ".join(r for _, r, _, b in REQUIRED_RULES if b in ("all", backend))
        if not denied:
            self.add("permissions", OK, f"every verb the {backend} backend uses on {asked} in {ns}")
            return
        grant = (
            f"kinetic-airflow doctor --print-rbac --namespace {ns} --rbac-user IDENTITY "
            "| kubectl apply -f - (a Role with exactly the verbs kinetic uses)"
        )
        detail = f"in namespace {ns} the identity may not: {', '.join(f'{v} {r}' for v, r in denied)}"
        no_events = [verb for verb, resource in denied if resource == "events"]
        if no_events:
            detail += f". {_WITHOUT_EVENTS_LIST if 'list' in no_events else _WITHOUT_EVENTS_WATCH}"
        if len(no_events) < len(denied):
            self.add("permissions", FAIL, detail, f"grant them: {grant}")
            return
        self.add(
            "permissions",
            WARN,
            detail,
            f'grant {" and ".join(no_events)} on events (apiGroups [""]) in {ns}: {grant}; or add '
            f"just those: kubectl create role kinetic-airflow-events -n {ns} --verb=list,watch "
            f"--resource=events && kubectl create rolebinding kinetic-airflow-events -n {ns} "
            "--role=kinetic-airflow-events --user=IDENTITY",
        )

    def _review(self, namespace: str, group: str, resource: str, verb: str) -> bool | None:
        plural, _, sub = resource.partition("/")
        attrs = {"namespace": namespace, "verb": verb, "group": group, "resource": plural}
        if sub:
            attrs["subresource"] = sub
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        try:
            answer = self.api.request(
                "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=body, retry=False
            )
        except ApiError:
            return None
        return bool((answer.get("status") or {}).get("allowed"))

    # namespace and service account -------------------------------------------------------
    def namespace(self) -> None:
        ns = self.s["namespace"]
        try:
            self.api.request("GET", f"/api/v1/namespaces/{ns}", retry=False)
        except ApiError as exc:
            if exc.status == 404:
                self.add(
                    "namespace",
                    FAIL,
                    f"namespace {ns!r} does not exist",
                    f"kubectl create namespace {ns} (or set [kinetic] namespace to an existing one)",
                )
                return
            if exc.status == 403:
                self.add(
                    "namespace",
                    WARN,
                    f"may not read namespace {ns!r} (a namespaced Role cannot); assuming it exists",
                    f"check with kubectl get namespace {ns}",
                )
                return
            raise
        self.add("namespace", OK, f"namespace {ns!r} exists")

    def service_account(self) -> None:
        ns, name = self.s["namespace"], self.s["service_account"]
        create = f"kubectl create serviceaccount {name} -n {ns}"
        try:
            sa = self.api.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/{name}", retry=False)
        except ApiError as exc:
            if exc.status == 404:
                self.add(
                    "service account",
                    FAIL,
                    f"service account {name!r} does not exist in namespace {ns!r}: no job pod can be "
                    "created (the ServiceAccount admission refuses it)",
                    f"{create}, then give it Workload Identity ({self._wi_fix(ns, name)}); or set "
                    "[kinetic] service_account to an existing one",
                )
                return
            if exc.status == 403:
                self.add(
                    "service account",
                    WARN,
                    f"may not read service account {name!r} in {ns!r}",
                    f"check with kubectl get serviceaccount {name} -n {ns} -o yaml",
                )
                return
            raise
        self.add("service account", OK, f"service account {name!r} exists in {ns!r}")
        self.workload_identity(sa)

    def _wi_fix(self, ns: str, name: str) -> str:
        project = self.s.get("project") or "PROJECT"
        return (
            f"kubectl annotate serviceaccount {name} -n {ns} {WORKLOAD_IDENTITY_ANNOTATION}="
            f"GSA@{project}.iam.gserviceaccount.com, and gcloud iam service-accounts add-iam-policy-binding "
            f"GSA@{project}.iam.gserviceaccount.com --role roles/iam.workloadIdentityUser --member "
            f'"serviceAccount:{project}.svc.id.goog[{ns}/{name}]"'
        )

    def workload_identity(self, sa: dict[str, Any]) -> None:
        ns, name = self.s["namespace"], self.s["service_account"]
        base = self._base_uri()
        annotation = ((sa.get("metadata") or {}).get("annotations") or {}).get(WORKLOAD_IDENTITY_ANNOTATION)
        if annotation:
            self.add(
                "workload identity",
                OK,
                f"pods of {name!r} act as {annotation} (check it has roles/storage.objectUser on "
                f"{_bucket(base) or 'the job bucket'})",
            )
            return
        if not base or not base.startswith("gs://"):
            self.add(
                "workload identity",
                OK,
                f"job storage is {base or 'not gs://'}: the pods need no Google identity for it",
            )
            return
        granted = self._bucket_grants_ksa(base, ns, name)
        if granted:
            self.add("workload identity", OK, f"{_bucket(base)} grants service account {name!r} {granted}")
            return
        project = self.s.get("project") or "PROJECT"
        self.add(
            "workload identity",
            FAIL,
            f"service account {name!r} has no {WORKLOAD_IDENTITY_ANNOTATION} annotation: job pods read the "
            f"payload from and write the result to {base} as the node's identity, which usually may not",
            f"{self._wi_fix(ns, name)}; grant that account roles/storage.objectUser on {_bucket(base)}. "
            "Or, without an annotation, grant the Kubernetes service account itself: gcloud storage "
            f"buckets add-iam-policy-binding {_bucket(base)} --role roles/storage.objectUser --member "
            f'"principal://iam.googleapis.com/projects/PROJECT_NUMBER/locations/global/workloadIdentityPools/'
            f'{project}.svc.id.goog/subject/ns/{ns}/sa/{name}"'
            " (doctor sees such a grant when it may read the bucket's IAM policy)",
        )

    def _bucket_grants_ksa(self, base: str, ns: str, name: str) -> str:
        """A storage role the bucket's IAM policy grants the KSA's Workload Identity principal."""
        client = getattr(self.storage_handle, "client", None)
        if client is None:
            return ""
        subject = f"/subject/ns/{ns}/sa/{name}"
        try:
            policy = client.bucket(_bucket(base)).get_iam_policy(requested_policy_version=3)
            bindings = list(policy.bindings)
        except Exception:  # no storage.buckets.getIamPolicy, or no IAM (an emulator): cannot tell
            return ""
        for binding in bindings:
            if binding.get("role", "").startswith("roles/storage.") and any(
                str(m).endswith(subject) for m in binding.get("members") or ()
            ):
                return str(binding["role"])
        return ""

    # storage -----------------------------------------------------------------------------
    def _base_uri(self) -> str | None:
        if self.s.get("base_uri"):
            return str(self.s["base_uri"]).rstrip("/")
        try:
            return default_base_uri(self.s["backend"], self.s.get("project"), self.s["cluster"])
        except ValueError:
            return None

    def storage(self) -> None:
        base = self._base_uri()
        if base is None:
            self.add(
                "job storage",
                FAIL,
                "no job storage: no base_uri and no project for kinetic's bucket",
                "set [kinetic] base_uri = gs://bucket/prefix (or [kinetic] project)",
            )
            return
        probe = f"{base}/.kinetic-doctor/probe.json"  # one small object, overwritten by every run
        token = uuid.uuid4().hex
        try:
            self.storage_handle = storage_for(base, self.s.get("gcp_conn_id"))
            self.storage_handle.write_text(probe, json.dumps({"time": time.time(), "token": token}))
            if json.loads(self.storage_handle.read_text(probe)).get("token") != token:
                raise RuntimeError("the probe read back is not the one written")
        except Exception as exc:
            bucket = _bucket(base)
            self.add(
                "job storage",
                FAIL,
                f"cannot write and read back a probe object under {base}: {exc}",
                (
                    f"create the bucket (gcloud storage buckets create gs://{bucket}) and grant the "
                    "worker's, triggerer's and API server's identity roles/storage.objectUser on it"
                    if bucket
                    else "make the directory writable by the worker and triggerer"
                ),
            )
            return
        self.add("job storage", OK, f"wrote and read back {probe}")

    # image -------------------------------------------------------------------------------
    def image(self) -> None:
        image = runner_image(
            self.spec,
            self.s.get("container_image"),
            self.s.get("project"),
            self.s.get("zone"),
            self.s.get("cluster"),
        )
        here = f"{sys.version_info[0]}.{sys.version_info[1]}"
        try:
            check_image_python(image)
        except ValueError as exc:
            self.add(
                "runner image",
                FAIL,
                str(exc).split(": cloudpickle")[0],
                f"use an image built for Python {here}: kinetic-airflow image --python {here}, then set "
                "[kinetic] container_image (or container_image_cpu / _gpu / _tpu)",
            )
            return
        tagged = re.search(r":(?:.*[^0-9])?py(\d+\.\d+)(?![0-9])", image)
        detail = (
            f"{image} is built for Python {here}, as this worker"
            if tagged
            else f"{image}: its tag names no Python version; the runner checks it when the pod starts"
        )
        self.add("runner image", OK, detail)

    # LeaderWorkerSet ---------------------------------------------------------------------
    def leaderworkerset(self) -> None:
        if self.s["backend"] != "pathways":
            self.add("leaderworkerset api", SKIP, f"not needed: {self.spec.text} runs on one host")
            return
        install = (
            "install LeaderWorkerSet: kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/"
            "releases/latest/download/manifests.yaml (https://lws.sigs.k8s.io/docs/installation/), or "
            "`kinetic up`"
        )
        try:
            group = self.api.request("GET", f"/apis/{LWS_GROUP}", retry=False)
        except ApiError as exc:
            if exc.status == 404:
                self.add(
                    "leaderworkerset api",
                    FAIL,
                    f"the cluster serves no {LWS_GROUP} API: {self.spec.text} spans {self.spec.hosts} hosts "
                    "and runs as a LeaderWorkerSet",
                    install,
                )
                return
            raise
        versions = [v.get("version") for v in group.get("versions") or []]
        preferred = (group.get("preferredVersion") or {}).get("version")
        if "v1" not in versions:
            self.add(
                "leaderworkerset api",
                FAIL,
                f"{LWS_GROUP} serves {', '.join(map(str, versions)) or 'no version'}, not v1 (LWS 0.5+)",
                "upgrade LeaderWorkerSet: " + install,
            )
            return
        served = ", ".join(map(str, versions))
        self.add("leaderworkerset api", OK, f"{LWS_GROUP} served (versions {served}; preferred {preferred})")

    # nodes -------------------------------------------------------------------------------
    def nodes(self) -> None:
        selectors = dict(self.spec.node_selectors)
        if self.spec.kind == "tpu":
            # GKE labels TPU nodes with their chips (gke-accelerator-count); a pod takes all of
            # them, so a v6e 2x4 pod of 4 chips needs a -4t node, not the -8t one of the same
            # topology (shared/ACCELERATORS.md section 0)
            selectors[LABEL_ACCELERATOR_COUNT] = str(self.spec.chips_per_host)
        wanted = ", ".join(f"{k}={v}" for k, v in selectors.items()) or "no node label (any node)"
        query = {"labelSelector": ",".join(f"{k}={v}" for k, v in selectors.items())} if selectors else None
        forbidden = False
        try:
            nodes = self.api.request("GET", "/api/v1/nodes", query=query, retry=False).get("items") or []
        except ApiError as exc:
            if exc.status != 403:
                raise
            nodes, forbidden = [], True
        hosts = self.spec.hosts
        if nodes:
            count = f"{len(nodes)} node(s)" + (f" (the slice needs {hosts})" if len(nodes) < hosts else "")
            self.add("accelerator nodes", OK, f"{count} for {self.spec.text}, which needs {wanted}")
            return
        pools = self._gke_capacity()
        if pools:
            self.add("accelerator nodes", OK, f"no node carries {wanted} now; {pools}")
            return
        fix = self._node_pool_fix()
        if forbidden:
            self.add(
                "accelerator nodes",
                WARN,
                f"may not list nodes (a namespaced Role cannot), no GKE node pool information; need {wanted}",
                f"check that a node pool provides {self.spec.text}; else {fix}",
            )
            return
        self.add(
            "accelerator nodes",
            FAIL,
            f"no node carries {wanted}"
            + (", and no node pool, auto-provisioning or Autopilot provides it" if self.gke_info else "")
            + f": pods of {self.spec.text} would stay Pending (Unschedulable)",
            fix,
        )

    def requirements_cache(self) -> None:
        setting = str(resolve_setting("requirements_cache") or "auto").strip().lower()
        info = self.gke_info
        autopilot = bool(getattr(getattr(info, "autopilot", None), "enabled", False))
        cluster = {"name": self.s.get("cluster"), "autopilot": autopilot}
        try:
            mode = requirements_cache_for(setting, cluster)
        except RequirementsCacheError as exc:
            self.add(
                "requirements cache",
                FAIL,
                f"{exc}: every job with requirements= would be refused",
                "set [kinetic] requirements_cache = auto (or emptydir)",
            )
            return
        where = (
            "an emptyDir per pod (each job installs its requirements again)"
            if mode == "emptydir"
            else f"the node's hostPath {ENV_CACHE_HOST_PATH} (reused by every job on the node)"
        )
        if info is not None:
            kind = "GKE Autopilot, which refuses writable hostPath volumes" if autopilot else "GKE Standard"
            self.add(
                "requirements cache",
                OK,
                f"requirements_cache={setting}: the cluster is {kind}; jobs "
                f"with requirements= cache their environments in {where}",
            )
            return
        caveat = (
            "; a Kubernetes connection does not tell whether the cluster is GKE Autopilot, which "
            "refuses it: there set [kinetic] requirements_cache = emptydir"
            if mode == "hostpath"
            else ""
        )
        self.add(
            "requirements cache",
            OK,
            f"requirements_cache={setting}: jobs with requirements= cache their environments in "
            f"{where}{caveat}",
        )

    def max_run_duration(self, seconds: int | None) -> None:
        label = f"{LABEL_MAX_RUN}={seconds}"
        info = self.gke_info
        said = (
            f"max_run_duration={seconds}s puts {label} in the pods' node selector, a label only node "
            "pools the cluster autoscaler creates (node auto-provisioning, Autopilot) carry by themselves"
        )
        fix = (
            "enable node auto-provisioning (its flex-start pools carry the label), give the flex-start "
            "node pool the label (gcloud container node-pools create ... --flex-start --node-labels "
            f"{label}), "
            "or drop max_run_duration and bound the VMs with the pool's own --max-run-duration"
        )
        autopilot = getattr(getattr(info, "autopilot", None), "enabled", False)
        if autopilot or getattr(getattr(info, "autoscaling", None), "enable_node_autoprovisioning", False):
            who = "Autopilot" if autopilot else "node auto-provisioning"
            self.add("max run duration", OK, f"{said}; here {who} creates such pools")
            return
        if info is not None:
            pools = [
                p.name
                for p in getattr(info, "node_pools", None) or []
                if ((getattr(getattr(p, "config", None), "labels", None) or {}).get(LABEL_MAX_RUN))
                == str(seconds)
            ]
            if pools:
                self.add("max run duration", OK, f"{said}; node pool {pools[0]!r} carries it")
            else:
                self.add(
                    "max run duration",
                    FAIL,
                    f"{said}; no node pool of the cluster carries it: the pods would stay Pending",
                    fix,
                )
            return
        try:
            query = {"labelSelector": f"{LABEL_FLEX_START}=true"}
            nodes = self.api.request("GET", "/api/v1/nodes", query=query, retry=False).get("items") or []
        except ApiError as exc:
            if exc.status != 403:
                raise
            self.add("max run duration", WARN, f"{said}; may not list nodes to see whether a pool does", fix)
            return
        values = sorted(
            {((n.get("metadata") or {}).get("labels") or {}).get(LABEL_MAX_RUN) or "none" for n in nodes}
        )
        if str(seconds) in values:
            self.add("max run duration", OK, f"{said}; flex-start nodes here carry it")
        elif nodes:
            self.add(
                "max run duration",
                FAIL,
                f"{said}; the flex-start nodes here carry {', '.join(values)}: the pods would stay Pending",
                fix,
            )
        else:
            self.add(
                "max run duration",
                WARN,
                f"{said}; no flex-start node is up now (pools scale from zero), so doctor cannot tell",
                fix,
            )

    def _gke_capacity(self) -> str:
        """What of the GKE cluster (node pools that scale from zero, NAP, Autopilot) can provide the spec."""
        info = self.gke_info
        if info is None:
            return ""
        spec = self.spec
        if getattr(getattr(info, "autopilot", None), "enabled", False):
            return "the cluster is Autopilot: it provisions nodes for the pod's selectors"
        for pool in getattr(info, "node_pools", None) or []:
            if _pool_provides(pool, spec):
                scaling = getattr(pool, "autoscaling", None)
                how = (
                    f"autoscaling up to {getattr(scaling, 'max_node_count', '?')} node(s)"
                    if getattr(scaling, "enabled", False)
                    else f"{getattr(pool, 'initial_node_count', '?')} node(s)"
                )
                return f"node pool {pool.name!r} provides it ({how})"
        autoscaling = getattr(info, "autoscaling", None)
        if getattr(autoscaling, "enable_node_autoprovisioning", False):
            limits = getattr(autoscaling, "resource_limits", None) or []
            if spec.kind == "cpu" or spec.gke_label in [getattr(r, "resource_type", "") for r in limits]:
                return f"node auto-provisioning may create it ({spec.gke_label or 'cpu'} in its limits)"
        return ""

    def _node_pool_fix(self) -> str:
        spec = self.spec
        cluster, zone = self.s.get("cluster") or "CLUSTER", self.s.get("zone") or "ZONE"
        spot = " --spot" if spec.spot else ""
        head = f"gcloud container node-pools create kinetic-{spec.kind} --cluster {cluster} --location {zone}"
        if spec.kind == "tpu":
            return (
                f"{head} --machine-type {spec.machine_type} --tpu-topology {spec.topology} "
                f"--num-nodes {spec.hosts}{spot} (or --enable-autoscaling --min-nodes 0 "
                f"--max-nodes {spec.hosts})"
            )
        if spec.kind == "gpu":
            return (
                f"{head} --accelerator type={spec.gke_label},count={spec.count},gpu-driver-version=latest "
                f"{'--machine-type ' + spec.machine_type + ' ' if spec.machine_type else ''}"
                f"--enable-autoscaling --min-nodes 0 --max-nodes 1{spot}"
            )
        return f"{head} --enable-autoscaling --min-nodes 0 --max-nodes 3{spot}"


def _pool_provides(pool: Any, spec: Any) -> bool:
    config = getattr(pool, "config", None)
    if spec.spot and not (getattr(config, "spot", False) or getattr(config, "preemptible", False)):
        return False
    machine = getattr(config, "machine_type", "") or ""
    accelerators = [getattr(a, "accelerator_type", "") for a in getattr(config, "accelerators", None) or []]
    if spec.kind == "tpu":
        topology = getattr(getattr(pool, "placement_policy", None), "tpu_topology", "") or ""
        return machine == spec.machine_type and (not topology or topology == spec.topology)
    if spec.kind == "gpu":
        return spec.gke_label in accelerators
    return not accelerators and not machine.startswith("ct")


def _bucket(base: str | None) -> str:
    return base[len("gs://") :].split("/", 1)[0] if base and base.startswith("gs://") else ""
