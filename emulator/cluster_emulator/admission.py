"""Pod admission: the API server's plugins that refuse pods a workload controller asks for.

A refused pod never exists; the controller that asked (Job, StatefulSet) only records a
``FailedCreate`` event, and the workload's status shows nothing. That is what a client
sees on a real cluster when the service account is missing, a ResourceQuota is full, or
the namespace enforces a Pod Security level, so the emulator refuses pods the same way,
with the API server's wording. Plugins run in kube-apiserver's order (ServiceAccount is
mutating and runs first, PodSecurity and ResourceQuota are validating; ResourceQuota is
last so that nothing refused later is charged).

Sources (kubernetes/kubernetes):

* ServiceAccount: ``plugin/pkg/admission/serviceaccount/admission.go``, ``Admit``: a pod
  naming a service account that does not exist is refused with
  ``error looking up service account <ns>/<name>: serviceaccount "<name>" not found``.
* PodSecurity: ``staging/src/k8s.io/pod-security-admission/admission/admission.go``,
  ``EvaluatePod`` (message ``violates PodSecurity "<level>:<version>": <reason> (<detail>),
  ...``) and the checks in ``staging/src/k8s.io/pod-security-admission/policy/check_*.go``.
  The level comes from the namespace label ``pod-security.kubernetes.io/enforce``.
* ResourceQuota: ``staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/
  controller.go``, ``checkRequest`` (``exceeded quota: <name>, requested: ..., used: ...,
  limited: ...``; ``failed quota: <name>: must specify ...``) and the pod evaluator's
  ``Constraints`` in ``pkg/quota/v1/evaluator/core/pods.go`` (quota on cpu/memory makes every
  container state that resource).

* GKE Autopilot (``Cluster(autopilot=True)``): GKE Warden, a validating admission webhook,
  enforces Autopilot's security constraints
  (https://cloud.google.com/kubernetes-engine/docs/concepts/autopilot-security, "Host options
  restrictions": hostPath only read-only under ``/var/log/``; no host ports). Its wording is not
  in a public repository; it is taken from refusals users quoted, e.g. SigNoz/charts#310 (2023)
  and SumoLogic/sumologic-kubernetes-collection#3437 (2023): ``admission webhook
  "warden-validating.common-webhooks.networking.gke.io" denied the request: GKE Warden rejected
  the request because it violates one or more constraints.\nViolations details:
  {"[denied by autogke-no-write-mode-hostpath]":["hostPath volume <v> in container <c> is
  accessed in write mode; disallowed in Autopilot.", "hostPath volume <v> used in container <c>
  uses path <p> which is not allowed in Autopilot. Allowed path prefixes for hostPath volumes
  are: [/var/log/]."], "[denied by autogke-no-host-port]":["container <c> specifies host ports
  [<ports>], which are disallowed in Autopilot."]}``. A webhook's denial becomes a 403
  ``<resource> "<name>" is forbidden: admission webhook "<webhook>" denied the request: <message>``
  (kubernetes ``staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/errors/statuserror.go``,
  ``ToStatusErr``). ValidatingAdmissionWebhook runs after PodSecurity and before ResourceQuota
  (``pkg/kubeapiserver/options/plugins.go``, ``AllOrderedPlugins``).

Every refusal is a 403 whose message starts ``pods "<name>" is forbidden: `` with the name
as sent (``<job>-`` for a Job's pods: admission runs before ``generateName`` is expanded).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from . import errors
from .resources import NAMESPACES, PODS, RESOURCEQUOTAS, SERVICEACCOUNTS

if TYPE_CHECKING:
    from .cluster import Cluster

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
_LEVELS = ("privileged", "baseline", "restricted")
_COMPUTE = ("cpu", "memory")
WARDEN_WEBHOOK = "warden-validating.common-webhooks.networking.gke.io"
AUTOPILOT_HOSTPATH_PREFIXES = ("/var/log/",)


def _forbidden(name: str, reason: str) -> errors.ApiError:
    # apierrors.NewForbidden: `<resource> "<name>" is forbidden: <err>`
    return errors.ApiError(
        403, "Forbidden", f'pods "{name}" is forbidden: {reason}', {"name": name, "kind": "pods"}
    )


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def _quantity(text: Any) -> float:
    from .kubelet import parse_quantity  # kubelet imports this module's users; import late

    return parse_quantity(text)


def _fmt(value: float) -> str:
    if float(value).is_integer():
        return str(int(value))
    if float(value * 1000).is_integer():
        return f"{int(value * 1000)}m"
    return f"{value:g}"


class PodAdmission:
    """The admission chain for pods of one emulated API server."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def admit(self, pod: dict[str, Any], name: str) -> None:
        """Raise the API server's 403 if a plugin refuses ``pod`` (``name`` as sent)."""
        ns = pod["metadata"].get("namespace") or "default"
        spec = pod.get("spec") or {}
        self._service_account(ns, spec, name)
        self._pod_security(ns, spec, name)
        self._autopilot(spec, name)
        self._quota(ns, spec, name)

    # ServiceAccount -------------------------------------------------------------------------
    def _service_account(self, ns: str, spec: dict[str, Any], name: str) -> None:
        account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        if self.cluster.store.get(SERVICEACCOUNTS, ns, account) is None:
            raise _forbidden(
                name,
                f'error looking up service account {ns}/{account}: serviceaccount "{account}" not found',
            )

    # PodSecurity ----------------------------------------------------------------------------
    def _pod_security(self, ns: str, spec: dict[str, Any], name: str) -> None:
        ns_obj = self.cluster.store.get(NAMESPACES, None, ns) or {"metadata": {}}
        labels = ns_obj["metadata"].get("labels") or {}
        level = labels.get(ENFORCE_LABEL, "privileged")
        if level not in _LEVELS or level == "privileged":
            return
        version = labels.get(ENFORCE_VERSION_LABEL, "latest")
        found = baseline_violations(spec)
        if level == "restricted":
            found += restricted_violations(spec)
        if found:
            raise _forbidden(name, f'violates PodSecurity "{level}:{version}": ' + ", ".join(found))

    # GKE Autopilot (GKE Warden) -------------------------------------------------------------
    def _autopilot(self, spec: dict[str, Any], name: str) -> None:
        if not getattr(self.cluster, "autopilot", False):
            return
        violations = autopilot_violations(spec)
        if violations:
            details = json.dumps(violations, separators=(",", ":"))
            raise _forbidden(
                name,
                f'admission webhook "{WARDEN_WEBHOOK}" denied the request: GKE Warden rejected the '
                "request because it violates one or more constraints.\nViolations details: " + details,
            )

    # ResourceQuota --------------------------------------------------------------------------
    def _quota(self, ns: str, spec: dict[str, Any], name: str) -> None:
        quotas = sorted(self.cluster.store.list(RESOURCEQUOTAS, ns), key=lambda q: q["metadata"]["name"])
        if not quotas:
            return
        requested = pod_usage(spec)
        used: dict[str, float] = {}
        for other in self.cluster.store.list(PODS, ns):
            # the pod evaluator charges only pods that are not terminal (QuotaV1Pod)
            if (other.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if other["metadata"].get("deletionTimestamp"):
                continue
            for key, value in pod_usage(other.get("spec") or {}).items():
                used[key] = used.get(key, 0.0) + value
        for quota in quotas:
            hard = {k: _quantity(v) for k, v in ((quota.get("spec") or {}).get("hard") or {}).items()}
            missing = self._missing_compute(spec, hard)
            if missing:
                raise _forbidden(name, f"failed quota: {quota['metadata']['name']}: must specify {missing}")
            exceeded = sorted(
                key for key in hard if key in requested and used.get(key, 0.0) + requested[key] > hard[key]
            )
            if exceeded:
                qname = quota["metadata"]["name"]
                req = ",".join(f"{k}={_fmt(requested[k])}" for k in exceeded)
                now = ",".join(f"{k}={_fmt(used.get(k, 0.0))}" for k in exceeded)
                lim = ",".join(f"{k}={_fmt(hard[k])}" for k in exceeded)
                raise _forbidden(
                    name, f"exceeded quota: {qname}, requested: {req}, used: {now}, limited: {lim}"
                )

    @staticmethod
    def _missing_compute(spec: dict[str, Any], hard: dict[str, float]) -> str:
        """``Constraints``: quota on (requests|limits).(cpu|memory) requires every container to say it."""
        missing: dict[str, list[str]] = {}
        for section in ("requests", "limits"):
            for resource in _COMPUTE:
                key = f"{section}.{resource}"
                wanted = key in hard or (section == "requests" and resource in hard)
                if not wanted:
                    continue
                for container in spec.get("containers") or []:
                    values = (container.get("resources") or {}).get(section) or {}
                    if resource not in values:
                        missing.setdefault(key, []).append(container.get("name", ""))
        return "; ".join(f"{key} for: {','.join(sorted(names))}" for key, names in sorted(missing.items()))


def pod_usage(spec: dict[str, Any]) -> dict[str, float]:
    """What one pod charges to a quota: ``pods`` and its requests/limits (containers summed, the
    largest init container if bigger, as the pod evaluator's ``PodUsageFunc`` does)."""
    usage: dict[str, float] = {"pods": 1.0, "count/pods": 1.0}
    for section in ("requests", "limits"):
        totals: dict[str, float] = {}
        for container in spec.get("containers") or []:
            for key, value in ((container.get("resources") or {}).get(section) or {}).items():
                totals[key] = totals.get(key, 0.0) + _quantity(value)
        for container in spec.get("initContainers") or []:
            for key, value in ((container.get("resources") or {}).get(section) or {}).items():
                totals[key] = max(totals.get(key, 0.0), _quantity(value))
        for key, value in totals.items():
            usage[f"{section}.{key}"] = value
            if section == "requests" and key in _COMPUTE:
                usage[key] = value  # the legacy unprefixed names mean requests
    return usage


def baseline_violations(spec: dict[str, Any]) -> list[str]:
    """The Pod Security "baseline" checks a kinetic pod can meet (policy/check_*.go, their
    ``ForbiddenReason (ForbiddenDetail)`` wording)."""
    out: list[str] = []
    hosts = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hosts:
        out.append(f"host namespaces ({', '.join(hosts)})")  # check_hostNamespaces.go
    privileged = [
        c.get("name", "")
        for c in _containers(spec)
        if ((c.get("securityContext") or {}).get("privileged")) is True
    ]
    if privileged:
        out.append(
            f"privileged ({_plural('container', privileged)} must not set securityContext.privileged=true)"
        )
    host_paths = [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]
    if host_paths:
        out.append(f"hostPath volumes ({_plural('volume', host_paths)})")  # check_hostPathVolumes.go
    with_ports = [c for c in _containers(spec) if any(p.get("hostPort") for p in c.get("ports") or [])]
    if with_ports:
        ports = [str(p["hostPort"]) for c in with_ports for p in c.get("ports") or [] if p.get("hostPort")]
        names = [c.get("name", "") for c in with_ports]
        out.append(f"hostPort ({_plural('container', names)} uses hostPort {', '.join(ports)})")
    return out


def autopilot_violations(spec: dict[str, Any]) -> dict[str, list[str]]:
    """GKE Warden's Autopilot constraints a kinetic pod can trip, keyed as Warden keys them: a
    hostPath volume must lie under ``/var/log/`` and every mount of it must be read-only; no
    container may ask for a host port (see the module docstring for the sources)."""
    out: dict[str, list[str]] = {}
    host_paths = {
        v.get("name", ""): (v.get("hostPath") or {}) for v in spec.get("volumes") or [] if "hostPath" in v
    }
    hostpath_rule: list[str] = []
    for container in _containers(spec):
        cname = container.get("name", "")
        for mount in container.get("volumeMounts") or []:
            volume = mount.get("name", "")
            if volume not in host_paths:
                continue
            if not mount.get("readOnly"):
                hostpath_rule.append(
                    f"hostPath volume {volume} in container {cname} is accessed in write mode; "
                    "disallowed in Autopilot."
                )
            path = str(host_paths[volume].get("path") or "")
            if not any((path.rstrip("/") + "/").startswith(p) for p in AUTOPILOT_HOSTPATH_PREFIXES):
                allowed = ", ".join(AUTOPILOT_HOSTPATH_PREFIXES)
                hostpath_rule.append(
                    f"hostPath volume {volume} used in container {cname} uses path {path} which is not "
                    f"allowed in Autopilot. Allowed path prefixes for hostPath volumes are: [{allowed}]."
                )
    if hostpath_rule:
        out["[denied by autogke-no-write-mode-hostpath]"] = hostpath_rule
    ports_rule = []
    for container in _containers(spec):
        ports = [str(p["hostPort"]) for p in container.get("ports") or [] if p.get("hostPort")]
        if ports:
            ports_rule.append(
                f"container {container.get('name', '')} specifies host ports [{' '.join(ports)}], which "
                "are disallowed in Autopilot."
            )
    if ports_rule:
        out["[denied by autogke-no-host-port]"] = ports_rule
    return out


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """The "restricted" checks on top of baseline (check_allowPrivilegeEscalation.go,
    check_capabilities_restricted.go, check_runAsNonRoot.go, check_seccompProfile_restricted.go)."""
    containers = _containers(spec)
    pod_ctx = spec.get("securityContext") or {}
    out: list[str] = []
    escalating = [
        c.get("name", "")
        for c in containers
        if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False
    ]
    if escalating:
        out.append(
            f"allowPrivilegeEscalation != false ({_plural('container', escalating)} must set "
            "securityContext.allowPrivilegeEscalation=false)"
        )
    not_dropped = [
        c.get("name", "")
        for c in containers
        if "ALL" not in (((c.get("securityContext") or {}).get("capabilities") or {}).get("drop") or [])
    ]
    if not_dropped:
        out.append(
            f"unrestricted capabilities ({_plural('container', not_dropped)} must set "
            'securityContext.capabilities.drop=["ALL"])'
        )
    if pod_ctx.get("runAsNonRoot") is not True:
        root = [
            c.get("name", "")
            for c in containers
            if (c.get("securityContext") or {}).get("runAsNonRoot") is not True
        ]
        if root:
            out.append(
                f"runAsNonRoot != true (pod or {_plural('container', root)} must set "
                "securityContext.runAsNonRoot=true)"
            )
    if ((pod_ctx.get("seccompProfile") or {}).get("type")) not in ("RuntimeDefault", "Localhost"):
        unset = [
            c.get("name", "")
            for c in containers
            if ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
            not in ("RuntimeDefault", "Localhost")
        ]
        if unset:
            out.append(
                f"seccompProfile (pod or {_plural('container', unset)} must set "
                'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'
            )
    return out


def _plural(noun: str, names: list[str]) -> str:
    """``container "a"`` / ``containers "a", "b"`` (pod-security-admission's joinQuote)."""
    quoted = ", ".join(f'"{n}"' for n in names)
    return f"{noun} {quoted}" if len(names) == 1 else f"{noun}s {quoted}"
