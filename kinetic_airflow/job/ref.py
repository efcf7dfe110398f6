"""``JobRef``: the one typed record that names a job, and its one JSON form.

A job reference outlives the process that wrote it: it is stored in trigger kwargs (a
triggerer restarted after an upgrade rebuilds the trigger from a row an older version
wrote), in the job record in ``task_state_store``, in ``job.json`` beside the job's files
and in the events a trigger sends. So its JSON form is a contract with every earlier
version, and these rules keep it:

* ``to_dict()`` writes the very keys and values the dict-shaped reference of earlier
  versions had, and nothing else: a deployment upgraded mid-run keeps reading what it
  wrote, and a downgraded one reads what the new version wrote.
* No version number is written. Earlier references carry none, so a reader could never
  take its absence to mean anything; and writing one would change the payload every
  reader already parses. Instead a field is only ever added, always optional, and its
  absence means what the versions before it assumed (``None``, or the default named
  below); a key whose meaning changes gets a new name, never a new meaning.
* ``None`` is "absent": an optional field that is None is left out of the JSON, as the
  old writer left the key out. The cluster fields (``K8sFields``) are the one exception:
  the old writer wrote them all together for every cluster job, null included
  (``service_account: null``), so they are written together whenever the group is there.
  A cluster reference of a version that lacked one of them re-encodes with it as null
  (or its default), which every reader takes as absent. Cluster fields added since
  (capacity and the Kueue queue) follow the general rule: left out when None.
* Keys this version does not know are kept (``extra``) and written back: a reference
  written by a newer version that passes through this one (a trigger, its event, the
  record saved afterwards) must not lose what the newer version needs.
* The cluster field (``ClusterRef``) is typed but reads as the mapping it is stored as (the
  Kubernetes layer looks its keys up), and writes back exactly the keys it was read with.
* A value of the wrong type is refused when decoded, by ``JobRefError`` naming the field:
  an error at the boundary says which record is damaged, a ``KeyError`` deep in a backend
  would not.
* The accelerator string is parsed once, into ``spec`` (an ``AcceleratorSpec``), when the
  reference is built: by the operator, which passes the spec it parsed, or on decoding, from
  the stored string. ``spec`` is never written: the string is the stored form, and every
  reader (older versions, keras-kinetic, the jobs CLI) parses that. A string this version
  cannot parse leaves ``spec`` None rather than refusing the reference, so a record of an
  older version stays readable; only code that needs the hardware (``accelerator_spec``)
  fails, naming it.

Lives in ``kinetic_airflow.job`` (no Airflow): the runner's side and the CLI read it too.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kinetic_airflow.job.accelerators import AcceleratorSpec, InvalidAcceleratorError, parse_accelerator
from kinetic_airflow.job.layout import JobIdentity

__all__ = ["ClusterRef", "JobRef", "JobRefError", "K8sFields"]


class JobRefError(ValueError):
    """A stored job reference that cannot be read (a missing or mistyped field)."""


_FIX = (
    "The reference comes from the trigger's kwargs, the job record in task_state_store or the job's "
    "job.json; one not written by kinetic-airflow (or edited by hand) cannot name a job: fix the field, "
    "or clear the task so that it runs a new job."
)

# What a field's JSON value may be, by its annotation: (Python types, words for the error).
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "str": ((str,), "a string"),
    "int": ((int,), "a whole number"),
    "float": ((int, float), "a number"),
    "dict": ((dict,), "a JSON object"),
    "list": ((list,), "a list of strings"),
}


def _kind(annotation: str) -> str:
    """``"dict[str, str] | None"`` -> ``"dict"``: the JSON kind a field's annotation names."""
    head = annotation.split("|")[0].strip()
    return head.split("[")[0]


def _check(owner: str, name: str, annotation: str, value: Any) -> Any:
    """``value`` if it has the field's type; else a ``JobRefError`` naming the field and the fix."""
    if value is None and "None" in annotation:
        return None
    kind = _kind(annotation)
    types, words = _KINDS[kind]
    ok = isinstance(value, types) and not isinstance(value, bool)
    if ok and kind == "list":
        ok = all(isinstance(item, str) for item in value)
    if not ok:
        raise JobRefError(
            f"kinetic job reference {owner}: field {name!r} must be {words}"
            f"{' or null' if 'None' in annotation else ''}, not {value!r} ({type(value).__name__}). {_FIX}"
        )
    return copy.deepcopy(value) if kind in ("dict", "list") else value


def _decoded(cls: type, owner: str, data: Mapping[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The dataclass fields of ``cls`` found in ``data``, checked (``skip``: decoded by the caller)."""
    return {
        f.name: _check(owner, f.name, str(f.type), data[f.name])
        for f in dataclasses.fields(cls)
        if f.name in data and f.name not in skip
    }


@dataclass(frozen=True, eq=False)  # equal as mappings: to the dict it was read from, too
class ClusterRef(Mapping[str, Any]):
    """How a cluster backend reaches its cluster: a Kubernetes connection id, or a GKE cluster's
    project, location and name with the endpoint and CA resolved from the GKE API (public data),
    and how to reach it (``backends.gke.client.gke_access``).

    A read-only mapping of the keys it was stored with (``None`` values included, as stored), so
    the Kubernetes layer reads it as it reads a cluster dict; ``to_dict`` is its JSON form.
    """

    kubernetes_conn_id: str | None = None
    gcp_conn_id: str | None = None
    project: str | None = None
    location: str | None = None
    name: str | None = None
    endpoint: str | None = None
    ca: str | None = None
    use_internal_ip: bool | None = None
    use_dns_endpoint: bool | None = None
    impersonation_chain: str | list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys of a newer version, kept
    # the stored keys, in their order (() for one built here: its fields that are not None)
    stored: tuple[str, ...] = field(default=(), repr=False)

    def _keys(self) -> tuple[str, ...]:
        if self.stored:
            return self.stored
        named = tuple(n for n in _CLUSTER_KEYS if getattr(self, n) is not None)
        return named + tuple(k for k in self.extra if k not in named)

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys():
            raise KeyError(key)
        return self.extra[key] if key in self.extra else getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def to_dict(self) -> dict[str, Any]:
        return {key: copy.deepcopy(self[key]) for key in self}

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> ClusterRef:
        """A cluster reference from the mapping the GKE client resolved (its keys kept)."""
        return cls.from_dict(value, "(new)")

    @classmethod
    def from_dict(cls, value: Any, owner: str = "(no job id)") -> ClusterRef:
        if isinstance(value, ClusterRef):
            return value
        if not isinstance(value, Mapping):
            raise JobRefError(
                f"kinetic job reference {owner}: field 'cluster' must be a JSON object, not {value!r}. {_FIX}"
            )
        fields: dict[str, Any] = {}
        for name in _CLUSTER_KEYS:
            if name not in value:
                continue
            item = value[name]
            if name in ("use_internal_ip", "use_dns_endpoint"):
                ok = item is None or isinstance(item, bool)
                words = "true, false or null"
            elif name == "impersonation_chain":
                ok = (
                    item is None
                    or isinstance(item, str)
                    or (isinstance(item, list) and all(isinstance(i, str) for i in item))
                )
                words = "a string, a list of strings or null"
            else:
                ok = item is None or isinstance(item, str)
                words = "a string or null"
            if not ok:
                raise JobRefError(
                    f"kinetic job reference {owner}: field 'cluster.{name}' must be {words}, "
                    f"not {item!r}. {_FIX}"
                )
            fields[name] = copy.deepcopy(item)
        extra = {k: copy.deepcopy(v) for k, v in value.items() if k not in _CLUSTER_KEYS}
        return cls(**fields, extra=extra, stored=tuple(value))


_CLUSTER_KEYS = tuple(f.name for f in dataclasses.fields(ClusterRef) if f.name not in ("extra", "stored"))


@dataclass(frozen=True)
class K8sFields:
    """What a cluster backend (GKE Job, Pathways LeaderWorkerSet) needs beyond the job's name;
    all of it public (connection ids, endpoint, CA), since trigger kwargs carry it."""

    # connection ids, project, location, name and endpoint (``backends.gke.client``)
    cluster: ClusterRef | None = None
    namespace: str = "default"
    node_selectors: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    runner_python: str | None = None
    service_account: str | None = None
    active_deadline_seconds: int | None = None
    container_env: dict[str, str] = field(default_factory=dict)
    pod_override: dict[str, Any] | None = None
    chips_per_host: int | None = None
    # Capacity and Kueue (kinetic_airflow.capacity); added later, so written only when set
    capacity: str | None = None
    max_run_seconds: int | None = None
    local_queue: str | None = None
    priority_class: str | None = None
    queue_timeout: float | None = None
    # Multislice (backends.gke.multislice): the slices of a JobSet; None is one slice
    slices: int | None = None

    def __post_init__(self) -> None:
        if self.cluster is not None and not isinstance(self.cluster, ClusterRef):
            object.__setattr__(self, "cluster", ClusterRef.of(self.cluster))  # a resolved dict

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _LATER_KEYS and value is None:
                continue
            out[f.name] = value.to_dict() if isinstance(value, ClusterRef) else copy.deepcopy(value)
        return out


_K8S_KEYS = frozenset(f.name for f in dataclasses.fields(K8sFields))
# cluster fields added after the group was first written: left out when None, as other fields are
_LATER_KEYS = frozenset(
    {"capacity", "max_run_seconds", "local_queue", "priority_class", "queue_timeout", "slices"}
)
_REQUIRED = ("job_id", "backend", "job_uri")


@dataclass(frozen=True)
class JobRef:
    """One job of one task instance's try and attempt, as every party names it.

    Trigger kwargs carry it, so it must never hold a secret (the job key travels out of band).
    """

    job_id: str
    backend: str
    job_uri: str
    base_uri: str | None = None
    identity: JobIdentity | None = None
    local_dir: str | None = None  # the worker machine's state directory of a local job
    python: str | None = None  # the local backend's interpreter
    accelerator: str | None = None  # what the job's chips are counted from (usage)
    submitted_at: float | None = None
    gcp_conn_id: str | None = None
    requirements: list[str] | None = None
    requirements_source: str | None = None
    fuse_data: list[str] | None = None
    hosts: int | None = None
    startup_timeout: float | None = None
    heartbeat_timeout: float | None = None
    debug: dict[str, Any] | None = None  # debug=True: job.debugging.debug_settings, for the manifest
    stop_grace_seconds: float | None = None  # the function's grace after SIGTERM (job.stop)
    k8s: K8sFields | None = None  # a cluster job's fields; None on the local backend
    # a capacity ladder's rung: {"rung": n (1-based), "of": rungs, "start_within": s} (kinetic_airflow.ladder)
    rung: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys of a newer version, kept as they were
    # ``accelerator`` parsed (never written; compared through the string): given by whoever
    # parsed it already, else parsed once here from ``accelerator`` (see the module's rules)
    spec: AcceleratorSpec | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.spec is None and isinstance(self.accelerator, str):
            object.__setattr__(self, "spec", _spec_or_none(self.accelerator))
        elif self.spec is not None and self.accelerator is None:
            object.__setattr__(self, "accelerator", self.spec.text)

    @property
    def job_identity(self) -> JobIdentity:
        """The identity, which every reference the operator writes has; a clear error otherwise."""
        if self.identity is None:
            raise JobRefError(
                f"kinetic job reference of job {self.job_id!r}: field 'identity' is missing. {_FIX}"
            )
        return self.identity

    @property
    def accelerator_spec(self) -> AcceleratorSpec:
        """The parsed accelerator, for code that needs the hardware (a clear error otherwise)."""
        if self.spec is None:
            raise JobRefError(
                f"kinetic job reference of job {self.job_id!r}: field 'accelerator' "
                f"({self.accelerator!r}) names no accelerator this version knows. {_FIX}"
            )
        return self.spec

    def on_cluster(self) -> K8sFields:
        """The cluster fields, for code that only runs for cluster jobs (a clear error otherwise)."""
        if self.k8s is None:
            raise JobRefError(
                f"kinetic job {self.job_id!r} ({self.backend}) has no cluster fields (cluster, namespace, "
                f"image, ...), so a cluster backend cannot reach it. {_FIX}"
            )
        return self.k8s

    def replace(self, **changes: Any) -> JobRef:
        """A copy with ``changes`` (the reference is frozen: a record that names it stays true).

        ``accelerator`` and ``spec`` stay in step: a new string without a spec is parsed, a new
        spec without a string writes its normalized text.
        """
        if "accelerator" in changes and "spec" not in changes:
            changes["spec"] = None
        elif "spec" in changes and "accelerator" not in changes:
            changes["accelerator"] = changes["spec"].text if changes["spec"] is not None else None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the keys earlier versions wrote, None left out (see the module's rules)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("k8s", "extra", "spec") or value is None:
                continue
            out[f.name] = value.to_dict() if isinstance(value, JobIdentity) else copy.deepcopy(value)
        if self.k8s is not None:
            out.update(self.k8s.to_dict())
        out.update({k: copy.deepcopy(v) for k, v in self.extra.items() if k not in out})
        return out

    @classmethod
    def from_dict(cls, value: Any) -> JobRef:
        """Decode any form a version of kinetic-airflow wrote (trigger kwargs, record, job.json,
        an event's brief reference); ``JobRefError`` naming the field for a damaged one."""
        if not isinstance(value, Mapping):
            raise JobRefError(
                f"a kinetic job reference must be a JSON object, not {type(value).__name__}. {_FIX}"
            )
        owner = repr(value["job_id"]) if isinstance(value.get("job_id"), str) else "(no job id)"
        for name in _REQUIRED:
            if name not in value:
                raise JobRefError(f"kinetic job reference {owner}: field {name!r} is missing. {_FIX}")
        fields = _decoded(cls, owner, value, skip=("identity", "k8s", "extra", "spec"))
        if value.get("identity") is not None:
            fields["identity"] = _identity(owner, value["identity"])
        if _K8S_KEYS & value.keys():
            k8s = _decoded(K8sFields, owner, value, skip=("cluster",))
            if value.get("cluster") is not None:
                k8s["cluster"] = ClusterRef.from_dict(value["cluster"], owner)
            fields["k8s"] = K8sFields(**k8s)
        known = {f.name for f in dataclasses.fields(cls)} - {"k8s", "extra", "spec"} | _K8S_KEYS
        fields["extra"] = {k: copy.deepcopy(v) for k, v in value.items() if k not in known}
        return cls(**fields)  # parses ``accelerator`` into ``spec``: the one parse of a stored reference


def _spec_or_none(text: str) -> AcceleratorSpec | None:
    """``text`` parsed; None for a string this version does not read (see the module's rules)."""
    try:
        return parse_accelerator(text)
    except InvalidAcceleratorError:
        return None


def _identity(owner: str, value: Any) -> JobIdentity:
    """The ``identity`` field: a ``JobIdentity`` dict (extra keys ignored, as ``from_dict`` does)."""
    if not isinstance(value, Mapping):
        raise JobRefError(
            f"kinetic job reference {owner}: field 'identity' must be a JSON object, not {value!r}. {_FIX}"
        )
    try:
        identity = JobIdentity.from_dict(dict(value))
    except TypeError:
        raise JobRefError(
            f"kinetic job reference {owner}: field 'identity' needs dag_id, run_id and task_id, "
            f"got {sorted(value)}. {_FIX}"
        ) from None
    for name in ("dag_id", "run_id", "task_id", "try_id"):
        _check(owner, f"identity.{name}", "str", getattr(identity, name))
    for name in ("map_index", "try_number", "attempt"):
        _check(owner, f"identity.{name}", "int", getattr(identity, name))
    return identity
