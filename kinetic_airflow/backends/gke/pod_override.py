"""``pod_override=``: the escape hatch for pod settings kinetic's options do not cover.

A dict in Kubernetes' JSON shape (``{"metadata": {...}, "spec": {...}}``) or a
``kubernetes.client.V1Pod`` is merged over the pod kinetic generates (the Job's pod
template, or every host's pod of a LeaderWorkerSet)::

    nested dicts         merge key by key (labels, annotations, resources, nodeSelector, affinity)
    "#key" (or key=None) removes what kinetic generated there ("#cluster-autoscaler...": None)
    lists of named items merge by ``name`` (containers, env, volumes, volumeMounts, ports,
                         imagePullSecrets); an item named "#NAME" removes NAME
    other lists          are extended (tolerations, topologySpreadConstraints, ...);
                         write "#tolerations" beside "tolerations" to replace them instead

kinetic's own container is ``kinetic-worker``; ``base`` (cncf-kubernetes' name for the
main container) means it too. The merged pod is checked before anything is submitted
and every problem names its field: unknown fields (against the Kubernetes client's own
models), label syntax, quantities, requests above limits, env entries, volume mounts
without a volume, and what kinetic itself relies on (the runner's command and image,
the restart policy, the ``app``/``job-id``/``kinetic.airflow/*`` labels).

The override travels in the job reference, which Airflow stores as plain JSON (trigger
kwargs, task state): a literal value for a credential-looking variable is refused.
Give a job a credential as ``valueFrom.secretKeyRef`` (a reference to a Kubernetes
Secret, not the secret) or a Secret volume.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from typing import Any

from kinetic_airflow.accelerators import parse_accelerator
from kinetic_airflow.backends.gke.manifest import build_job_manifest
from kinetic_airflow.envcapture import _CREDENTIAL_LOOKING

__all__ = [
    "PodOverrideError",
    "apply_pod_override",
    "check_pod_template",
    "combined_override",
    "merge_override",
    "normalize_pod_override",
]

CONTAINER_NAME = "kinetic-worker"  # as in backends.gke.manifest (not imported: no cycle)
_CNCF_BASE = "base"
# kinetic's tools, its ownership check and kinetic's own CLI find jobs by these.
_KINETIC_LABELS = ("app", "job-id", "job-name")
_KINETIC_LABEL_PREFIX = "kinetic.airflow/"
# Lists merged by "name" (everything else is extended).
_NAMED_LISTS = {
    "containers",
    "initContainers",
    "ephemeralContainers",
    "env",
    "volumes",
    "volumeMounts",
    "volumeDevices",
    "ports",
    "imagePullSecrets",
    "resourceClaims",
    "readinessGates",
}
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")
_SUFFIX = {
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
_ENV_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef", "fileKeyRef")


class PodOverrideError(ValueError):
    """A pod override that cannot be applied, naming the field and the fix."""


# Normalising what the user gave -------------------------------------------------------------
def normalize_pod_override(value: Any, *, source: str = "pod_override") -> dict[str, Any] | None:
    """A plain JSON dict from a dict, a ``kubernetes.client`` model or JSON text (the config)."""
    if value is None or value == "" or value == {}:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise PodOverrideError(
                f"{source} is not valid JSON ({exc}): write it as a JSON object, e.g. "
                '{"spec": {"containers": [{"name": "kinetic-worker", "resources": {"requests": '
                '{"memory": "16Gi"}}}]}}'
            ) from None
    if hasattr(value, "openapi_types") and hasattr(value, "attribute_map"):
        # Start-up cost: the Kubernetes client loads only when a cluster is used.
        from kubernetes.client import ApiClient

        value = ApiClient().sanitize_for_serialization(value)
    if not isinstance(value, dict):
        raise PodOverrideError(
            f"{source} must be a dict in Kubernetes' JSON shape ({{'metadata': ..., 'spec': ...}}) or a "
            f"kubernetes.client.V1Pod, got {type(value).__name__}"
        )
    try:
        value = json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise PodOverrideError(
            f"{source} must hold only JSON values (strings, numbers, booleans, lists, dicts): {exc}. "
            "Quantities are strings ('16Gi'), as in a Kubernetes manifest."
        ) from None
    for key in value:
        if key in ("apiVersion", "kind"):
            continue
        if key.lstrip("#") not in ("metadata", "spec"):
            raise PodOverrideError(
                f"{source}: {key!r} is not part of a pod; a pod override has 'metadata' (labels, "
                "annotations) and 'spec' (containers, volumes, tolerations, affinity, ...)"
            )
    if value.get("kind", "Pod") != "Pod":
        raise PodOverrideError(
            f"{source}: kind {value['kind']!r} is not a Pod; override the pod, not its Job"
        )
    value.pop("apiVersion", None)
    value.pop("kind", None)
    _refuse_literal_secrets(value, source)
    return value


def _refuse_literal_secrets(value: dict[str, Any], source: str) -> None:
    spec = value.get("spec") or {}
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or []:
            if not isinstance(container, dict):
                continue
            for item in container.get("env") or []:
                if not isinstance(item, dict):
                    continue
                name = str(item.get("name", ""))
                if "value" in item and _CREDENTIAL_LOOKING.search(name):
                    raise PodOverrideError(
                        f"{source}: env {name} has a literal value, but it looks like a credential and the "
                        "override is stored as plain JSON in Airflow's metadata DB (trigger kwargs, task "
                        "state). Put it in a Kubernetes Secret and reference it: {'name': "
                        f"'{name}', 'valueFrom': {{'secretKeyRef': {{'name': 'my-secret', 'key': "
                        "'my-key'}}}}."
                    )


def combined_override(default: Any, task: Any) -> dict[str, Any] | None:
    """``[kinetic] pod_override`` first, then the task's own override over it."""
    base = normalize_pod_override(default, source="[kinetic] pod_override")
    own = normalize_pod_override(task)
    if base is None:
        return own
    if own is None:
        return base
    return _combine(base, own)


def _combine(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two overrides as one (applying the result = applying first, then second)."""
    out = copy.deepcopy(first)
    removals = [k for k in second if k.startswith("#") or second[k] is None]
    for key in removals:  # first: "#tolerations" beside "tolerations" replaces them
        out.pop(key.lstrip("#"), None)
        out["#" + key.lstrip("#")] = None
    for key, value in second.items():
        if key in removals:
            continue
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _combine(out[key], value)
        elif isinstance(value, list) and isinstance(out.get(key), list) and key in _NAMED_LISTS:
            named = {str(i.get("name", "")).lstrip("#"): i for i in value if isinstance(i, dict)}
            kept = [i for i in out[key] if not (isinstance(i, dict) and i.get("name") in named)]
            for item in value:
                same = [i for i in out[key] if isinstance(i, dict) and i.get("name") == item.get("name")]
                earlier = same[0] if same else None
                kept.append(_combine(earlier, item) if earlier is not None else copy.deepcopy(item))
            out[key] = kept
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = out[key] + [copy.deepcopy(i) for i in value if i not in out[key]]
        else:
            out[key] = copy.deepcopy(value)
    return out


# Merging --------------------------------------------------------------------------------------
def merge_override(base: dict[str, Any], override: dict[str, Any], path: str = "") -> dict[str, Any]:
    """``base`` (generated) with ``override`` merged over it, by the rules in the module docstring."""
    out = dict(base)
    for key, value in override.items():
        if key.startswith("#") or value is None:
            out.pop(key.lstrip("#"), None)
    for key, value in override.items():
        if key.startswith("#") or value is None:
            continue
        here = f"{path}.{key}" if path else key
        current = out.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            out[key] = merge_override(current, value, here)
        elif isinstance(current, list) and isinstance(value, list):
            out[key] = _merge_list(current, value, key, here)
        else:
            out[key] = _clean(value, key)
    return out


def _clean(value: Any, key: str = "") -> Any:
    """A new subtree: removal markers there have nothing to remove."""
    if isinstance(value, dict):
        return {k: _clean(v, k) for k, v in value.items() if not k.startswith("#") and v is not None}
    if isinstance(value, list):
        items = [_clean(v) for v in value]
        if key in _NAMED_LISTS:
            items = [i for i in items if not (isinstance(i, dict) and str(i.get("name", "")).startswith("#"))]
        return items
    return value


def _item_name(item: Any, key: str, path: str, index: int) -> str:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        hint = f" (name it {CONTAINER_NAME!r} to change kinetic's container)" if key == "containers" else ""
        raise PodOverrideError(f"pod_override: {path}[{index}] needs a 'name': {key} merge by name{hint}")
    name = item["name"]
    return CONTAINER_NAME if key == "containers" and name in (_CNCF_BASE, f"#{_CNCF_BASE}") else name


def _merge_list(base: list[Any], override: list[Any], key: str, path: str) -> list[Any]:
    if key not in _NAMED_LISTS:
        out = list(base)
        for item in override:
            item = _clean(item)
            if item not in out:
                out.append(item)
        return out
    out = [dict(i) if isinstance(i, dict) else i for i in base]
    for index, item in enumerate(override):
        name = _item_name(item, key, path, index)
        if name.startswith("#"):
            out = [i for i in out if not (isinstance(i, dict) and i.get("name") == name[1:])]
            continue
        item = {**item, "name": name}
        for position, existing in enumerate(out):
            if isinstance(existing, dict) and existing.get("name") == name:
                out[position] = merge_override(existing, item, f"{path}[{name}]")
                break
        else:
            out.append(_clean(item))
    return out


def apply_pod_override(
    template: dict[str, Any], override: dict[str, Any] | None, *, owner: str = "Job"
) -> dict[str, Any]:
    """The pod template (``{"metadata", "spec"}``) with ``override`` merged in, checked."""
    if not override:
        return template
    merged = merge_override(template, override)
    check_pod_template(merged, template, owner=owner)
    return merged


# Checking the result --------------------------------------------------------------------------
def check_pod_template(pod: dict[str, Any], generated: dict[str, Any], *, owner: str = "Job") -> None:
    """Refuse a merged pod Kubernetes (or kinetic) would refuse, naming the field and the fix."""
    problems: list[str] = []
    _check_model(pod.get("metadata") or {}, "V1ObjectMeta", "metadata", problems)
    _check_model(pod.get("spec") or {}, "V1PodSpec", "spec", problems)
    if not problems:
        _check_semantics(pod, generated, owner, problems)
    if problems:
        raise PodOverrideError(
            "pod_override gives an invalid pod:\n  - "
            + "\n  - ".join(problems)
            + "\nFix the override (Kubernetes JSON field names, e.g. imagePullSecrets, nodeSelector)."
        )


def _model_class(name: str) -> Any:
    # Start-up cost: the Kubernetes client loads only when a cluster is used.
    import kubernetes.client.models as models

    return getattr(models, name, None)


def _check_model(value: Any, type_name: str, path: str, problems: list[str]) -> None:
    """Walk ``value`` against the kubernetes client's model ``type_name`` (its openapi types)."""
    if type_name.startswith("list["):
        if not isinstance(value, list):
            problems.append(f"{path} must be a list, got {type(value).__name__}")
            return
        inner = type_name[5:-1]
        for index, item in enumerate(value):
            label = item.get("name") if isinstance(item, dict) and item.get("name") else index
            _check_model(item, inner, f"{path}[{label}]", problems)
        return
    if type_name.startswith(("dict(", "dict[")):  # "dict(str, str)" in older clients
        if not isinstance(value, dict):
            problems.append(f"{path} must be a mapping, got {type(value).__name__}")
            return
        inner = type_name[5:-1].split(", ", 1)[1]
        for key, item in value.items():
            _check_model(item, inner, f"{path}.{key}", problems)
        return
    primitive = {"str": str, "int": int, "bool": bool, "float": (int, float), "datetime": str}
    if type_name in primitive:
        expected = primitive[type_name]
        if (isinstance(value, bool) and type_name != "bool") or not isinstance(value, expected):
            if type_name == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
                problems.append(f"{path} must be a string (quote it: {str(value)!r})")
            else:
                problems.append(f"{path} must be {type_name}, got {type(value).__name__} {value!r}")
        return
    if type_name == "object":
        return
    model = _model_class(type_name)
    if model is None:
        return
    if not isinstance(value, dict):
        problems.append(f"{path} must be an object ({type_name[2:]}), got {type(value).__name__}")
        return
    fields = {json_key: model.openapi_types[attr] for attr, json_key in model.attribute_map.items()}
    for key, item in value.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            snake = _camel(key) if "_" in key else None
            if snake in fields:
                hint = f"; Kubernetes JSON writes it {snake!r}"
            elif close:
                hint = f"; did you mean {close[0]!r}?"
            else:
                hint = ""
            problems.append(f"{path}.{key} is not a field of {type_name[2:]}{hint}")
            continue
        _check_model(item, fields[key], f"{path}.{key}", problems)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _quantity(text: Any) -> float | None:
    match = _QUANTITY.match(str(text))
    if not match:
        return None
    number, suffix = match.group(1), match.group(3) or ""
    if suffix[:1] in ("e", "E"):
        return float(f"{number}{suffix}")
    return float(number) * _SUFFIX[suffix]


def _check_labels(labels: dict[str, Any], path: str, problems: list[str], *, values: bool) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))) or not _LABEL_NAME.match(
            name
        ):
            problems.append(
                f"{path}: {key!r} is not a valid key (an optional DNS prefix/ and a name of up to 63 "
                "letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
            )
        if values and not _LABEL_VALUE.match(str(value)):
            problems.append(
                f"{path}.{key}: {value!r} is not a valid label value (up to 63 letters, digits, '-', '_', "
                "'.', starting and ending with a letter or digit; quote numbers)"
            )


def _check_semantics(pod: dict[str, Any], generated: dict[str, Any], owner: str, problems: list[str]) -> None:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    gen_meta, gen_spec = generated.get("metadata") or {}, generated.get("spec") or {}
    labels = meta.get("labels") or {}
    _check_labels(labels, "metadata.labels", problems, values=True)
    _check_labels(meta.get("annotations") or {}, "metadata.annotations", problems, values=False)
    for key, value in (gen_meta.get("labels") or {}).items():
        if (key in _KINETIC_LABELS or key.startswith(_KINETIC_LABEL_PREFIX)) and labels.get(key) != value:
            problems.append(
                f"metadata.labels.{key} is kinetic's own label ({value!r}): kinetic, kinetic's CLI and the "
                "ownership check find the job by it; use another label key"
            )
    if spec.get("restartPolicy") != gen_spec.get("restartPolicy"):
        problems.append(
            f"spec.restartPolicy must stay {gen_spec.get('restartPolicy')!r} (a {owner}'s pods need it; "
            "Airflow's retries and kinetic's preemption handling restart jobs)"
        )
    containers = spec.get("containers") or []
    names = [c.get("name") for c in containers if isinstance(c, dict)]
    _duplicates(names, "spec.containers", problems)
    generated_worker = next(c for c in gen_spec["containers"] if c["name"] == CONTAINER_NAME)
    worker = next((c for c in containers if c.get("name") == CONTAINER_NAME), None)
    if worker is None:
        problems.append(f"spec.containers: kinetic's container {CONTAINER_NAME!r} was removed")
    else:
        for field, fix in (
            ("command", "kinetic's runner is the command"),
            ("args", "kinetic's runner takes no other arguments"),
            ("image", "use container_image= or [kinetic] container_image"),
        ):
            if worker.get(field) != generated_worker.get(field):
                problems.append(f"spec.containers[{CONTAINER_NAME}].{field} cannot be overridden: {fix}")
    volumes = {v.get("name") for v in spec.get("volumes") or [] if isinstance(v, dict)}
    _duplicates([v.get("name") for v in spec.get("volumes") or []], "spec.volumes", problems)
    for volume in spec.get("volumes") or []:
        name = volume.get("name")
        if not name or not _DNS_LABEL.match(str(name)):
            problems.append(f"spec.volumes[{name}]: the name must be a DNS label (lowercase, digits, '-')")
        sources = [k for k in volume if k != "name"]
        if len(sources) != 1:
            problems.append(
                f"spec.volumes[{name}] needs exactly one source (persistentVolumeClaim, secret, configMap, "
                f"emptyDir, csi, ...), got {sources or 'none'}"
            )
    for secret in spec.get("imagePullSecrets") or []:
        if not secret.get("name"):
            problems.append("spec.imagePullSecrets: each entry needs the 'name' of a docker-registry Secret")
    for toleration in spec.get("tolerations") or []:
        operator = toleration.get("operator", "Equal")
        if operator not in ("Equal", "Exists"):
            problems.append(f"spec.tolerations: operator {operator!r} must be 'Equal' or 'Exists'")
        if operator == "Exists" and toleration.get("value"):
            problems.append("spec.tolerations: an 'Exists' toleration takes no value")
        if toleration.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            problems.append(
                f"spec.tolerations: effect {toleration.get('effect')!r} must be NoSchedule, "
                "PreferNoSchedule or NoExecute"
            )
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or []:
            _check_container(container, f"spec.{group}[{container.get('name')}]", volumes, problems)


def _duplicates(names: list[Any], path: str, problems: list[str]) -> None:
    seen: set[Any] = set()
    for name in names:
        if name in seen:
            problems.append(f"{path}: {name!r} appears twice")
        seen.add(name)


def _check_container(container: dict[str, Any], path: str, volumes: set[Any], problems: list[str]) -> None:
    if not container.get("image"):
        problems.append(f"{path} needs an image")
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    for kind, values in (("limits", limits), ("requests", requests)):
        for resource, amount in values.items():
            if _quantity(amount) is None:
                problems.append(
                    f"{path}.resources.{kind}.{resource}: {amount!r} is not a Kubernetes quantity "
                    "(e.g. '500m', '2', '16Gi')"
                )
    for resource, amount in requests.items():
        limit = limits.get(resource)
        want, cap = _quantity(amount), _quantity(limit) if limit is not None else None
        if want is None or limit is None or cap is None:
            continue
        if "/" in resource and resource.split("/")[0] not in ("kubernetes.io",) and want != cap:
            problems.append(
                f"{path}.resources: {resource} is an extended resource; its request ({amount}) must equal "
                f"its limit ({limit})"
            )
        elif want > cap:
            problems.append(f"{path}.resources.requests.{resource} ({amount}) exceeds its limit ({limit})")
    env_names = []
    for item in container.get("env") or []:
        name = item.get("name")
        env_names.append(name)
        if not name or not _ENV_NAME.match(str(name)):
            problems.append(f"{path}.env: {name!r} is not a valid variable name")
        if "value" in item and "valueFrom" in item:
            problems.append(f"{path}.env[{name}] has both value and valueFrom: keep one")
        source = item.get("valueFrom")
        if source is not None:
            kinds = [k for k in source if k in _ENV_SOURCES]
            if len(kinds) != 1:
                problems.append(
                    f"{path}.env[{name}].valueFrom needs exactly one of secretKeyRef, configMapKeyRef, "
                    "fieldRef, resourceFieldRef"
                )
            for ref_kind in ("secretKeyRef", "configMapKeyRef"):
                ref = source.get(ref_kind)
                if ref is not None and (not ref.get("name") or not ref.get("key")):
                    problems.append(f"{path}.env[{name}].valueFrom.{ref_kind} needs a 'name' and a 'key'")
    _duplicates(env_names, f"{path}.env", problems)
    for mount in container.get("volumeMounts") or []:
        if mount.get("name") not in volumes:
            problems.append(
                f"{path}.volumeMounts[{mount.get('name')}]: there is no volume of that name in spec.volumes; "
                "add it there too"
            )
        if not str(mount.get("mountPath", "")).startswith("/"):
            problems.append(f"{path}.volumeMounts[{mount.get('name')}].mountPath must be an absolute path")


# Where kinetic calls it ----------------------------------------------------------------------
def _pod_template_slots(manifest: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Where a Job or LeaderWorkerSet manifest holds its pod templates (LWS: leader and worker),
    as (parent, key) so a template can be replaced."""
    spec = manifest.get("spec") or {}
    if manifest.get("kind") == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        return [(lwt, k) for k in ("leaderTemplate", "workerTemplate") if isinstance(lwt.get(k), dict)]
    return [(spec, "template")] if isinstance(spec.get("template"), dict) else []


def apply_to_manifest(manifest: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    """The manifest with ``override`` merged into every pod template, checked (before any POST)."""
    if not override:
        return manifest
    kind = manifest.get("kind", "Job")
    for parent, key in _pod_template_slots(manifest):
        parent[key] = apply_pod_override(parent[key], override, owner=kind)
    return manifest


def validate_at_parse(
    override: Any, accelerator: str, spot: bool, configured: Any = None
) -> dict[str, Any] | None:
    """At DAG import: normalise the task's override and try it (with ``[kinetic] pod_override``)
    on a Job pod for this accelerator, so a bad override is an import error, not a failed run.
    ``configured`` is ``[kinetic] pod_override``, resolved by the caller."""
    own = normalize_pod_override(override)
    combined = combined_override(configured, own)
    if combined is None:
        return own
    labels = {"app": "kinetic", "job-id": "parse-check", _KINETIC_LABEL_PREFIX + "ti": "x"}
    trial = build_job_manifest(
        name="kinetic-parse-check",
        namespace="default",
        labels=labels,
        annotations={},
        spec=parse_accelerator(accelerator, spot=spot or None),
        image="runner:parse-check",
        job_uri="gs://bucket/jobs/parse-check",
    )
    apply_to_manifest(trial, combined)
    return own
