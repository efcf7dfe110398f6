"""Admission for the emulator: schema validation, semantic checks and API defaulting.

Built-in kinds are validated with ``kubernetes_validate`` against the real
Kubernetes OpenAPI schemas (strict: unknown fields are errors, as with
``fieldValidation=Strict``). LeaderWorkerSets and JobSets are validated against
their upstream CRDs' ``openAPIV3Schema`` with ``jsonschema``. Then a few semantic
rules the real API server enforces (names, labels, restart policies) are
checked, because those are the mistakes a provider makes in production.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import yaml

from . import upstream
from ._util import DNS1123_LABEL, DNS1123_SUBDOMAIN, ENV_VAR_NAME, LABEL_NAME, LABEL_VALUE
from .resources import JOBS, JOBSETS, LWS, PODS, ResourceType

LWS_SCHEMA_FILENAME = "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
LWS_SCHEMA_ENV = "KINETIC_LWS_SCHEMA"
# The CRDs are vendored in crds/ by emulator/scripts/vendor_crds.py (Apache-2.0, crds/LICENSE.*),
# which records each one's release in crds/UPSTREAM.json.
JOBSET_SCHEMA_FILENAME = "jobset.x-k8s.io_jobsets.yaml"

Cause = dict[str, str]


def _kubernetes_version() -> str:
    # Newest schema set kubernetes-validate ships, as "major.minor" (e.g. "1.37").
    return ".".join(kubernetes_validate.utils.latest_version().split(".")[:2])


#: Kubernetes version the emulator validates against and reports in ``/version``.
K8S_VERSION: str = _kubernetes_version()


class InvalidError(Exception):
    """The object failed validation; ``causes`` become the Status details."""

    def __init__(self, rt: ResourceType, name: str, causes: list[Cause]) -> None:
        self.rt = rt
        self.name = name
        self.causes = causes
        summary = ", ".join(
            f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes
        )
        if len(causes) > 1:
            summary = f"[{summary}]"
        super().__init__(f'{rt.kind_qualified} "{name}" is invalid: {summary}')


def _cause(field: str, message: str, reason: str = "FieldValueInvalid") -> Cause:
    return {"reason": reason, "message": message, "field": field}


def _json_path(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _schema_error_cause(error: jsonschema.ValidationError) -> Cause:
    field = _json_path(error.absolute_path)
    if error.validator == "additionalProperties":
        # Mirror the API server's strict decoding message: name the unknown field.
        instance = error.instance if isinstance(error.instance, dict) else {}
        allowed = set((error.schema or {}).get("properties", {}))
        unknown = sorted(k for k in instance if k not in allowed) or ["?"]
        full = f"{field}.{unknown[0]}" if field else unknown[0]
        return _cause(full, f'unknown field "{full}"', "FieldValueUnknown")
    if error.validator == "required":
        return _cause(field, f"Required value: {error.message}", "FieldValueRequired")
    return _cause(field, f"Invalid value: {error.message}")


# ------------------------------------------------------------------ built-in kinds
def validate_builtin(obj: dict[str, Any], *, strict: bool = True) -> list[Cause]:
    """Validate a built-in object with ``kubernetes_validate`` (strict by default)."""
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=strict)
    except kubernetes_validate.ValidationError as exc:
        return [_schema_error_cause(exc)]
    except kubernetes_validate.SchemaNotFoundError:
        return []
    return []


# ------------------------------------------------------------------------- the CRD
def _candidate_schema_paths() -> list[Path]:
    paths: list[Path] = []
    env = os.environ.get(LWS_SCHEMA_ENV)
    if env:
        paths.append(Path(env))
    here = Path(__file__).resolve().parent
    paths.append(upstream.CRD_DIR / LWS_SCHEMA_FILENAME)
    for parent in here.parents:
        paths.append(parent / "shared" / "schemas" / LWS_SCHEMA_FILENAME)
    return paths


def lws_schema_path() -> Path:
    """Where the LeaderWorkerSet CRD is read from: ``$KINETIC_LWS_SCHEMA``, the packaged copy, ../shared."""
    tried = _candidate_schema_paths()
    for path in tried:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"LeaderWorkerSet CRD schema not found; set {LWS_SCHEMA_ENV} to the CRD YAML. Tried: "
        + ", ".join(str(p) for p in tried)
    )


def _openapi_to_jsonschema(node: Any, strict: bool) -> Any:
    if isinstance(node, list):
        return [_openapi_to_jsonschema(item, strict) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: _openapi_to_jsonschema(v, strict) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not") or key in ("anyOf", "allOf", "oneOf"):
            out[key] = _openapi_to_jsonschema(value, strict)
        elif key == "default":
            out[key] = value
        elif isinstance(value, (dict, list)) and not key.startswith("x-"):
            out[key] = _openapi_to_jsonschema(value, strict)
        else:
            out[key] = value
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        out.pop("type", None)
    if (
        strict
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _load_crd(
    path: Path, version_name: str, strict: bool
) -> tuple[dict[str, Any], jsonschema.protocols.Validator]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~15x faster on an 18k-line CRD
    with open(path, encoding="utf-8") as fh:
        crd = yaml.load(fh, Loader=loader)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == version_name)
    raw = version["schema"]["openAPIV3Schema"]
    schema = _openapi_to_jsonschema(raw, strict)
    validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return raw, validator_cls(schema)


@functools.lru_cache(maxsize=4)
def _lws_crd(strict: bool) -> tuple[dict[str, Any], jsonschema.protocols.Validator]:
    return _load_crd(lws_schema_path(), LWS.version, strict)


@functools.lru_cache(maxsize=4)
def _jobset_crd(strict: bool) -> tuple[dict[str, Any], jsonschema.protocols.Validator]:
    return _load_crd(upstream.CRD_DIR / JOBSET_SCHEMA_FILENAME, JOBSETS.version, strict)


def _schema_causes(validator: jsonschema.protocols.Validator, obj: dict[str, Any]) -> list[Cause]:
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    return [_schema_error_cause(e) for e in errors[:10]]


# kubernetes-sigs/kueue ``config/components/crd/bases/`` and kubernetes/autoscaler
# ``cluster-autoscaler/apis/config/crd/`` at the releases crds/UPSTREAM.json names: validated like
# the JobSet CRD (structural schema of the storage version; CEL rules are not run).
KUEUE_CRD_FILES = {
    "workloads": "kueue.x-k8s.io_workloads.yaml",
    "clusterqueues": "kueue.x-k8s.io_clusterqueues.yaml",
    "localqueues": "kueue.x-k8s.io_localqueues.yaml",
    "resourceflavors": "kueue.x-k8s.io_resourceflavors.yaml",
    "workloadpriorityclasses": "kueue.x-k8s.io_workloadpriorityclasses.yaml",
    "admissionchecks": "kueue.x-k8s.io_admissionchecks.yaml",
    "provisioningrequestconfigs": "kueue.x-k8s.io_provisioningrequestconfigs.yaml",
    "provisioningrequests": "autoscaling.x-k8s.io_provisioningrequests.yaml",
}


def _go_flags(node: Any) -> None:
    """Go's RE2 takes ``^(?i)...`` (AdmissionCheck's parameters.kind); Python wants flags first."""
    if isinstance(node, dict):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and pattern.startswith("^(?i)"):
            node["pattern"] = "(?i)^" + pattern[len("^(?i)") :]
        for value in node.values():
            _go_flags(value)
    elif isinstance(node, list):
        for value in node:
            _go_flags(value)


@functools.lru_cache(maxsize=32)
def _kueue_crd(
    plural: str, version: str, strict: bool
) -> tuple[dict[str, Any], jsonschema.protocols.Validator]:
    raw, validator = _load_crd(upstream.CRD_DIR / KUEUE_CRD_FILES[plural], version, strict)
    _go_flags(validator.schema)
    return raw, validator


def validate_crd_object(rt: ResourceType, obj: dict[str, Any], *, strict: bool = True) -> list[Cause]:
    """Validate a Kueue / ProvisioningRequest object against its vendored CRD schema."""
    return _schema_causes(_kueue_crd(rt.plural, rt.version, strict)[1], obj)


def default_crd_object(rt: ResourceType, obj: dict[str, Any]) -> None:
    """The CRD's structural defaults (e.g. ClusterQueue ``queueingStrategy: BestEffortFIFO``)."""
    raw, _ = _kueue_crd(rt.plural, rt.version, True)
    _apply_schema_defaults(raw, obj)


def validate_lws(obj: dict[str, Any], *, strict: bool = True) -> list[Cause]:
    """Validate a LeaderWorkerSet against the CRD's openAPIV3Schema (unknown fields rejected if strict)."""
    return _schema_causes(_lws_crd(strict)[1], obj)


def validate_jobset(obj: dict[str, Any], *, strict: bool = True) -> list[Cause]:
    """Validate a JobSet against the CRD's openAPIV3Schema (unknown fields rejected if strict)."""
    return _schema_causes(_jobset_crd(strict)[1], obj)


def _apply_schema_defaults(schema: dict[str, Any], data: Any) -> None:
    if isinstance(data, dict) and isinstance(schema.get("properties"), dict):
        for key, sub in schema["properties"].items():
            if key not in data and "default" in sub:
                data[key] = copy.deepcopy(sub["default"])
            if key in data:
                _apply_schema_defaults(sub, data[key])
    elif isinstance(data, list) and isinstance(schema.get("items"), dict):
        for item in data:
            _apply_schema_defaults(schema["items"], item)


def default_lws(obj: dict[str, Any]) -> None:
    """Apply the CRD's structural defaults (replicas, size, restartPolicy, startupPolicy...)."""
    raw, _ = _lws_crd(True)
    _apply_schema_defaults(raw, obj)
    # The LWS webhook maps the deprecated restartPolicy Default to None.
    lwt = (obj.get("spec") or {}).get("leaderWorkerTemplate")
    if isinstance(lwt, dict) and lwt.get("restartPolicy") == "Default":
        lwt["restartPolicy"] = "None"


def default_jobset(obj: dict[str, Any]) -> None:
    """The CRD's structural defaults, then the JobSet webhook's (kubernetes-sigs/jobset
    ``pkg/webhooks/jobset_webhook.go``, ``Default``): success policy All, startup AnyOrder,
    Indexed completion and OnFailure restarts for every replicated job's template, DNS
    hostnames and not-ready addresses published, failure-policy rules named by position."""
    raw, _ = _jobset_crd(True)
    _apply_schema_defaults(raw, obj)
    spec = obj.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rjob in spec.get("replicatedJobs") or []:
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        if not pod_spec.get("restartPolicy"):
            pod_spec["restartPolicy"] = "OnFailure"
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for i, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        if not rule.get("name"):
            rule["name"] = f"failurePolicyRule{i}"


# --------------------------------------------------------------------- semantics
def _check_name(obj: dict[str, Any], max_len: int = 253) -> list[Cause]:
    name = (obj.get("metadata") or {}).get("name") or ""
    if not name:
        return [
            _cause("metadata.name", "Required value: name or generateName is required", "FieldValueRequired")
        ]
    causes = []
    if not DNS1123_SUBDOMAIN.match(name):
        causes.append(
            _cause(
                "metadata.name",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                "character (e.g. 'example.com', regex used for validation is "
                "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            )
        )
    if len(name) > max_len:
        causes.append(
            _cause("metadata.name", f'Invalid value: "{name}": must be no more than {max_len} characters')
        )
    return causes


def _check_labels(labels: Any, field: str) -> list[Cause]:
    causes = []
    for key, value in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if not LABEL_NAME.match(name) or len(name) > 63 or (prefix and not DNS1123_SUBDOMAIN.match(prefix)):
            causes.append(
                _cause(
                    field,
                    f'Invalid value: "{key}": name part must consist of alphanumeric characters, '
                    "'-', '_' or '.', and must start and end with an alphanumeric character",
                )
            )
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            causes.append(
                _cause(
                    field,
                    f'Invalid value: "{value}": a valid label must be an empty string or consist of '
                    "alphanumeric characters, '-', '_' or '.', and must start and end with an "
                    "alphanumeric character, and be no more than 63 characters",
                )
            )
    return causes


def check_pod_spec(
    spec: dict[str, Any], path: str, allowed_restart: tuple[str, ...] | None = None
) -> list[Cause]:
    """Semantic checks of a PodSpec the API server enforces (names, images, env names, restartPolicy)."""
    causes: list[Cause] = []
    containers = spec.get("containers") or []
    if not containers:
        causes.append(_cause(f"{path}.containers", "Required value", "FieldValueRequired"))
    seen: set[str] = set()
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            cpath = f"{path}.{group}[{i}]"
            name = container.get("name") or ""
            if not name:
                causes.append(_cause(f"{cpath}.name", "Required value", "FieldValueRequired"))
            elif not DNS1123_LABEL.match(name) or len(name) > 63:
                causes.append(
                    _cause(
                        f"{cpath}.name", f'Invalid value: "{name}": a lowercase RFC 1123 label is required'
                    )
                )
            elif name in seen:
                causes.append(_cause(f"{cpath}.name", f'Duplicate value: "{name}"', "FieldValueDuplicate"))
            seen.add(name)
            if not (container.get("image") or "").strip():
                causes.append(_cause(f"{cpath}.image", "Required value", "FieldValueRequired"))
            for j, env in enumerate(container.get("env") or []):
                env_name = env.get("name") or ""
                if not ENV_VAR_NAME.match(env_name):
                    causes.append(
                        _cause(
                            f"{cpath}.env[{j}].name",
                            f'Invalid value: "{env_name}": a valid environment variable name must '
                            "consist of alphabetic characters, digits, '_', '-', or '.', and must not "
                            "start with a digit",
                        )
                    )
    restart = spec.get("restartPolicy")
    valid = allowed_restart or ("Always", "OnFailure", "Never")
    if restart is not None and restart not in valid:
        supported = ", ".join(f'"{v}"' for v in valid)
        causes.append(
            _cause(
                f"{path}.restartPolicy",
                f'Unsupported value: "{restart}": supported values: {supported}',
                "FieldValueNotSupported",
            )
        )
    return causes


def check_pod(pod: dict[str, Any]) -> list[Cause]:
    """Semantic checks for a Pod."""
    causes = _check_name(pod)
    causes += _check_labels(pod["metadata"].get("labels"), "metadata.labels")
    causes += check_pod_spec(pod.get("spec") or {}, "spec")
    return causes


def check_job(job: dict[str, Any]) -> list[Cause]:
    """Semantic checks for a Job (restartPolicy Never/OnFailure, Indexed needs completions...)."""
    causes = _check_name(job, 63)
    causes += _check_labels(job["metadata"].get("labels"), "metadata.labels")
    spec = job.get("spec") or {}
    template = spec.get("template") or {}
    causes += _check_labels((template.get("metadata") or {}).get("labels"), "spec.template.metadata.labels")
    pod_spec = template.get("spec") or {}
    if pod_spec.get("restartPolicy") is None:
        causes.append(
            _cause(
                "spec.template.spec.restartPolicy",
                'Required value: valid values: "OnFailure", "Never"',
                "FieldValueRequired",
            )
        )
    allowed = ("Never",) if spec.get("podFailurePolicy") else ("OnFailure", "Never")
    causes += check_pod_spec(pod_spec, "spec.template.spec", allowed)
    for field in (
        "parallelism",
        "completions",
        "backoffLimit",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
    ):
        value = spec.get(field)
        if isinstance(value, int) and value < 0:
            causes.append(
                _cause(f"spec.{field}", f"Invalid value: {value}: must be greater than or equal to 0")
            )
    if spec.get("activeDeadlineSeconds") == 0:
        causes.append(_cause("spec.activeDeadlineSeconds", "Invalid value: 0: must be greater than 0"))
    if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
        causes.append(
            _cause(
                "spec.completions", "Required value: when completion mode is Indexed", "FieldValueRequired"
            )
        )
    return causes


def check_lws(lws: dict[str, Any]) -> list[Cause]:
    """Semantic checks for a LeaderWorkerSet (name, size >= 1, template labels)."""
    causes = _check_name(lws, 63)
    causes += _check_labels(lws["metadata"].get("labels"), "metadata.labels")
    lwt = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
    size = lwt.get("size", 1)
    if isinstance(size, int) and size < 1:
        causes.append(
            _cause(
                "spec.leaderWorkerTemplate.size", f"Invalid value: {size}: must be greater than or equal to 1"
            )
        )
    for key in ("leaderTemplate", "workerTemplate"):
        template = lwt.get(key)
        if template:
            path = f"spec.leaderWorkerTemplate.{key}"
            causes += _check_labels((template.get("metadata") or {}).get("labels"), f"{path}.metadata.labels")
            causes += check_pod_spec(template.get("spec") or {}, f"{path}.spec")
    return causes


_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _dns1035(value: str, too_long: str) -> str | None:
    if len(value) > 63:
        return too_long
    if not _DNS1035_LABEL.fullmatch(value):
        return (
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with "
            "an alphabetic character, and end with an alphanumeric character"
        )
    return None


def _generated_name_causes(path: str, generated: str, shown: str, kind: str) -> list[Cause]:
    """The webhook's cause for a generated name that is not a DNS-1035 label (it shows the
    longest Job name in both cases)."""
    problem = _dns1035(
        generated,
        f"JobSet name is too long, {kind} names generated for this JobSet will exceed 63 characters",
    )
    return [_cause(f"{path}.name", f"Invalid value: {shown!r}: {problem}")] if problem else []


def check_jobset(jobset: dict[str, Any]) -> list[Cause]:
    """Semantic checks for a (defaulted) JobSet, as its webhook makes them.

    kubernetes-sigs/jobset ``pkg/webhooks/jobset_webhook.go`` (``ValidateCreate``, at 08dfbdf):
    the longest child Job name ``<jobset>-<replicatedJob>-<replicas - 1>`` must be a DNS-1035
    label, and so must the longest pod name of an Indexed job with completions,
    ``<job>-<completions - 1>-abcde`` (the five characters a generated name adds).
    """
    causes = _check_name(jobset, 63)
    causes += _check_labels(jobset["metadata"].get("labels"), "metadata.labels")
    name = jobset["metadata"].get("name") or ""
    for i, rjob in enumerate((jobset.get("spec") or {}).get("replicatedJobs") or []):
        path = f"spec.replicatedJobs[{i}]"
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        longest_job = f"{name}-{rjob.get('name', '')}-{int(rjob.get('replicas', 1)) - 1}"
        causes += _generated_name_causes(path, longest_job, longest_job, "job")
        completions = job_spec.get("completions")
        # the mutating webhook runs first and defaults an unset completionMode to Indexed
        if job_spec.get("completionMode", "Indexed") == "Indexed" and completions is not None:
            longest_pod = f"{longest_job}-{int(completions) - 1}-abcde"
            causes += _generated_name_causes(path, longest_pod, longest_job, "pod")
        pod = job_spec.get("template") or {}
        causes += _check_labels(
            (pod.get("metadata") or {}).get("labels"), f"{path}.template.spec.template.metadata.labels"
        )
        causes += check_pod_spec(pod.get("spec") or {}, f"{path}.template.spec.template.spec")
    return causes


def validate_object(rt: ResourceType, obj: dict[str, Any], *, strict: bool = True) -> None:
    """Schema + semantic validation for Pods, Jobs and LeaderWorkerSets; raises :class:`InvalidError`."""
    name = (obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get("generateName") or ""
    if rt is LWS:
        causes = validate_lws(obj, strict=strict)
        if not causes:
            causes = check_lws(obj)
    elif rt is JOBSETS:
        causes = validate_jobset(obj, strict=strict)
        if not causes:
            causes = check_jobset(obj)
    elif rt.plural in KUEUE_CRD_FILES and not rt.builtin:
        causes = validate_crd_object(rt, obj, strict=strict)
    elif rt in (PODS, JOBS):
        causes = validate_builtin(obj, strict=strict)
        if not causes:
            causes = check_pod(obj) if rt is PODS else check_job(obj)
    else:
        causes = validate_builtin(obj, strict=strict) if rt.builtin else []
    if causes:
        raise InvalidError(rt, name, causes)


# --------------------------------------------------------------------- defaulting
def _image_pull_policy(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        return "IfNotPresent"
    if ":" not in last or last.endswith(":latest"):
        return "Always"
    return "IfNotPresent"


def default_pod_spec(spec: dict[str, Any]) -> None:
    """PodSpec defaults from ``SetDefaults_PodSpec`` / ``SetDefaults_Container``."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or []:
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("imagePullPolicy", _image_pull_policy(container.get("image") or ""))
            container.setdefault("resources", {})
            for port in container.get("ports") or []:
                port.setdefault("protocol", "TCP")
            for env in container.get("env") or []:
                field_ref = (env.get("valueFrom") or {}).get("fieldRef")
                if field_ref is not None:
                    field_ref.setdefault("apiVersion", "v1")


def default_pod(pod: dict[str, Any]) -> None:
    """Defaults and admission mutations applied to every new Pod."""
    spec = pod.setdefault("spec", {})
    default_pod_spec(spec)
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.setdefault("tolerations", [])
    present = {(t.get("key"), t.get("effect")) for t in tolerations}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if (key, "NoExecute") not in present:
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )


JOB_LABELS = (
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
    "controller-uid",
    "job-name",
)


def default_job(job: dict[str, Any], uid: str) -> None:
    """Job defaults and the generated selector the API server adds on create."""
    spec = job.setdefault("spec", {})
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
        spec["parallelism"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("manualSelector", None)
    if spec["manualSelector"] is None:
        spec.pop("manualSelector")
    spec.setdefault(
        "podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed"
    )
    name = job["metadata"]["name"]
    template = spec.setdefault("template", {})
    tmeta = template.setdefault("metadata", {})
    labels = tmeta.setdefault("labels", {})
    if not spec.get("manualSelector"):
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        labels.update(
            {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
            }
        )
    if not job["metadata"].get("labels"):
        job["metadata"]["labels"] = dict(labels)
    default_pod_spec(template.setdefault("spec", {}))


def check_immutable(rt: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """Fields the API server refuses to change on update (Job template/selector, most of a Pod spec)."""
    causes: list[Cause] = []
    if rt is JOBS:
        old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
        fields = ["selector", "completionMode", "podFailurePolicy"]
        if not old_spec.get("suspend"):
            fields.append("template")
        for field in fields:
            if old_spec.get(field) != new_spec.get(field):
                causes.append(_cause(f"spec.{field}", "Invalid value: field is immutable"))
    elif rt is PODS:
        mutable = ("activeDeadlineSeconds", "tolerations", "schedulingGates", "terminationGracePeriodSeconds")

        def strip(spec: dict[str, Any]) -> dict[str, Any]:
            spec = copy.deepcopy(spec)
            for key in mutable:
                spec.pop(key, None)
            for group in ("containers", "initContainers"):
                for container in spec.get(group) or []:
                    container.pop("image", None)
            return spec

        if strip(old.get("spec") or {}) != strip(new.get("spec") or {}):
            causes.append(
                _cause(
                    "spec",
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                    "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` "
                    "(only additions to existing tolerations), `spec.terminationGracePeriodSeconds`",
                    "FieldValueForbidden",
                )
            )
    return causes
