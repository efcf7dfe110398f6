"""Reusing a result (``cache=True``): a task whose job would be the same as an earlier successful
one returns that job's result instead of launching another.

**The key** is computed from what the job ships, never from what the DAG author says: the
payload's SHA-256 (cloudpickle of the function, its arguments with ``Data`` staged and upstream
results as references, the captured environment, the volumes), the DAG code archive's digest,
the requirements, the runner image, the backend, the accelerator (its class and shape; Spot or
on-demand does not change a result), the number of slices, the client's fingerprint (Python,
cloudpickle, kinetic-airflow, job-file format) and ``cache_version``. Before a job exists the
worker prepares the payload exactly as ``ship_payload`` would (``submission.prepare_payload``)
and digests it without storing it (``job.payload.payload_digest``). After a job succeeded the
entry is keyed by its *manifest*, read back and checked with the job's key (the manifest's HMAC
vouches for the payload and code digests the runner checked): the key of what really ran.

**The index** lives in Airflow's metadata DB, where the job keys live, as one Airflow Variable a
key (``kinetic_cache.<key>``): job storage is writable by every job pod and many people, and an
index there could point a task at anything. A Variable is written through the Execution API by
the worker that verified the result, and holds nothing secret: the job, where it ran, the task
instance that made it, the *SHA-256 of its verified result envelope*, and what it cost.

**A hit** reads the envelope from the earlier job's storage and checks its digest against the
entry before unpickling anything (``envelope.load_checked_envelope``, as a ``ResultRef`` is
loaded): a bucket writer who replaced the result afterwards is refused, named in the task log,
and the task runs a new job instead. Only a result that was delivered as a success is ever
entered, so a retry after a failure can never get a failed result back.

**A fresh run**: trigger the DAG run with conf ``{"kinetic_fresh_run": true}`` (every cached task
of the run) or ``{"kinetic_fresh_run": ["task_id", ...]}``; such a run does not look the cache up
and its results replace the entries. Clearing a cached task reuses the result again (the clear
runs the same inputs); to run one fresh, delete its Variable (the log names it), or change
``cache_version``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kinetic_airflow.config import KineticSettingError, resolve_setting
from kinetic_airflow.job.envelope import load_checked_envelope
from kinetic_airflow.job.integrity import check_digest, verify_manifest
from kinetic_airflow.job.layout import JobLayout
from kinetic_airflow.job.payload import fingerprint, payload_digest
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.job.states import EVENT_SUCCESS
from kinetic_airflow.job.storage import Storage
from kinetic_airflow.lifecycle import Phase, load_record, save_record
from kinetic_airflow.results import KineticJobError, check_envelope_format, to_xcom
from kinetic_airflow.submission import PayloadParts, prepare_payload
from kinetic_airflow.usage import USAGE_XCOM_KEY, reused_usage, totals

__all__ = [
    "CACHE_XCOM_KEY",
    "FRESH_RUN_CONF",
    "VARIABLE_PREFIX",
    "CacheEntry",
    "Lookup",
    "cache_key",
    "fresh_run_reason",
    "key_of_manifest",
    "load_cached_envelope",
    "lookup_key",
    "read_entry",
    "remember",
    "reuse_words",
    "signing_key",
    "variable_name",
    "write_entry",
]

log = logging.getLogger(__name__)

CACHE_XCOM_KEY = "kinetic_cache"
FRESH_RUN_CONF = "kinetic_fresh_run"
VARIABLE_PREFIX = "kinetic_cache."
_KEY_TAG = b"kinetic-cache-v1\n"
_ENTRY_VERSION = 1


# The key ---------------------------------------------------------------------------------------
def _accelerator_class(ref: JobRef) -> str:
    """The accelerator without its Spot suffix: the same chips compute the same result."""
    spec = ref.spec
    if spec is not None:
        return spec.with_spot(False).text
    return (ref.accelerator or "cpu").removesuffix(":spot")


def cache_key(
    ref: JobRef,
    *,
    payload_sha256: str,
    code_sha256: str | None,
    requirements: list[str] | None,
    image: str | None,
    client: dict[str, Any],
    cache_version: str | None,
) -> str:
    """The cache key (hex SHA-256) of a job with this payload, code, environment and accelerator."""
    fields = {
        "payload_sha256": payload_sha256,
        "code_sha256": code_sha256,
        "requirements": list(requirements or []),
        "image": image,
        "backend": ref.backend,
        "accelerator": _accelerator_class(ref),
        "slices": (ref.k8s.slices if ref.k8s is not None else None) or 1,
        "client": client,
        "cache_version": cache_version,
    }
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(_KEY_TAG + text.encode()).hexdigest()


def lookup_key(
    ref: JobRef,
    storage: Storage,
    *,
    python_callable: Any,
    op_args: Any,
    op_kwargs: Any,
    volumes: Any,
    capture_env_vars: Any,
    dag_file: str | None,
    dags_folder: str | None,
    cache_version: str | None,
    task_label: str = "",
    others: Sequence[JobRef] = (),
) -> tuple[list[str], PayloadParts]:
    """The key of the job ``ref`` would be, before it exists, then those of ``others`` (the other
    rungs of a capacity ladder: the same payload on another accelerator or image): its payload
    prepared as ``ship_payload`` prepares it and digested, nothing stored but content-addressed
    uploads (the code archive, ``Data``) the job would make anyway. Also the prepared parts: on a
    miss the job ships them as they are (``ship_payload(parts=...)``), not prepared again."""
    parts = prepare_payload(
        storage, ref.base_uri, python_callable, op_args, op_kwargs, volumes, capture_env_vars, dag_file,
        dags_folder,
    )  # fmt: skip
    digest = payload_digest(
        python_callable, parts.args, parts.kwargs, env=parts.env, volumes=parts.volumes, task_label=task_label
    )
    keys = [
        cache_key(
            each,
            payload_sha256=digest,
            code_sha256=(parts.code or {}).get("sha256"),
            requirements=each.requirements,
            image=each.k8s.image if each.k8s is not None else None,
            client=fingerprint(),
            cache_version=cache_version,
        )
        for each in (ref, *others)
    ]
    return keys, parts


def key_of_manifest(ref: JobRef, storage: Storage, job_key: str, cache_version: str | None) -> str:
    """The key of a job that ran: from its manifest, checked with the job's key (its HMAC vouches
    for the payload and code digests the runner verified before it ran anything)."""
    uri = JobLayout(ref.job_uri).manifest
    text = storage.read_text_or_none(uri)
    if not text:
        raise KineticJobError(f"job {ref.job_id} has no manifest at {uri}")
    fields = verify_manifest(text, job_key, uri, "the job record in Airflow's metadata DB")
    code = fields.get("code")
    return cache_key(
        ref,
        payload_sha256=str(fields.get("sha256") or ""),
        code_sha256=code.get("sha256") if isinstance(code, dict) else None,
        requirements=fields.get("requirements") or [],
        image=fields.get("image"),
        client=fields.get("fingerprint") or {},
        cache_version=cache_version,
    )


def fresh_run_reason(context: Any, task_id: str) -> str | None:
    """Why this run must not reuse a result (its conf asks for a fresh run), or None."""
    dag_run = context.get("dag_run")
    conf = getattr(dag_run, "conf", None) or {}
    asked = conf.get(FRESH_RUN_CONF) if isinstance(conf, dict) else None
    if asked is True or (isinstance(asked, str) and asked.strip().lower() in ("true", "1", "yes")):
        return f'the DAG run\'s conf has "{FRESH_RUN_CONF}": true'
    if isinstance(asked, (list, tuple)) and task_id in asked:
        return f'the DAG run\'s conf "{FRESH_RUN_CONF}" names task {task_id!r}'
    return None


# The index -------------------------------------------------------------------------------------
def variable_name(key: str) -> str:
    return VARIABLE_PREFIX + key


@dataclass(frozen=True)
class CacheEntry:
    """One reusable result: the job that made it, the digest of its verified result envelope,
    the task instance that ran it and what it cost (``chip_hours``, ``run_seconds``)."""

    key: str
    job_id: str
    job_uri: str
    backend: str
    result_sha256: str
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    accelerator: str
    chip_hours: float
    run_seconds: float
    created: float
    version: int = _ENTRY_VERSION

    @property
    def result_uri(self) -> str:
        """Host 0's envelope of the job: derived from the job's folder, not stored apart."""
        return JobLayout(self.job_uri).result()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: Any, key: str) -> CacheEntry:
        """The entry stored under ``key``; ``ValueError`` names what is wrong with it."""
        if not isinstance(value, dict):
            raise ValueError("it is not a JSON object")
        texts = ("key", "job_id", "job_uri", "backend", "result_sha256", "dag_id", "run_id", "task_id")
        numbers = ("chip_hours", "run_seconds", "created")
        wrong = [k for k in texts if not isinstance(value.get(k), str) or not value[k]]
        wrong += [k for k in numbers if type(value.get(k)) not in (int, float)]
        wrong += [k for k in ("map_index", "try_number", "version") if type(value.get(k)) is not int]
        if wrong:
            raise ValueError(f"its field(s) {', '.join(wrong)} are missing or of the wrong type")
        if value["version"] != _ENTRY_VERSION:
            raise ValueError(f"it is entry version {value['version']}, this worker reads {_ENTRY_VERSION}")
        if value["key"] != key:
            raise ValueError(f"it names key {value['key']}, not the key it is stored under")
        return cls(**{name: value[name] for name in cls.__dataclass_fields__ if name != "accelerator"},
                   accelerator=str(value.get("accelerator") or "cpu"))  # fmt: skip


_SIGNATURE = "hmac"  # the field of a signed entry holding its HMAC
_MIN_SIGNING_KEY = 32


def signing_key() -> str | None:
    """``[kinetic] cache_signing_key``, checked: None when it is not set."""
    key = resolve_setting("cache_signing_key")
    if key and len(key) < _MIN_SIGNING_KEY:
        raise KineticSettingError(
            f"[kinetic] cache_signing_key is {len(key)} characters long: a signing key needs "
            f"{_MIN_SIGNING_KEY} or more to be unguessable. Set it to the output of `openssl rand -hex 32` "
            "(AIRFLOW__KINETIC__CACHE_SIGNING_KEY_SECRET or _CMD), the same on every worker."
        )
    return key or None


def _signature(secret: str, fields: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in fields.items() if k != _SIGNATURE}, sort_keys=True, default=str)
    return hmac.new(secret.encode(), b"kinetic-cache-entry-v1\n" + body.encode(), hashlib.sha256).hexdigest()


def read_entry(key: str, logger: Any = None) -> CacheEntry | None:
    """The entry of ``key`` in the metadata DB, or None (none, or one that cannot be used: the
    task then runs its job, and its success writes a good entry). With ``[kinetic]
    cache_signing_key`` set, an entry must carry its HMAC under that key. Why an entry is not used
    goes to ``logger`` (the task's)."""
    # Airflow start-up cost: loaded when called, not when this module is imported.
    from airflow.sdk import Variable

    logger = logger or log
    secret = signing_key()
    name = variable_name(key)
    text = Variable.get(name, default=None)
    if text is None:
        return None
    try:
        fields = json.loads(text) if isinstance(text, str) else text
        entry = CacheEntry.from_dict(fields, key)
    except ValueError as exc:
        logger.warning("the result cache entry %s cannot be used (%s): running the job", name, exc)
        return None
    if secret is not None and not hmac.compare_digest(
        str(fields.get(_SIGNATURE) or ""), _signature(secret, fields)
    ):
        logger.warning(
            "the result cache entry %s is not signed with [kinetic] cache_signing_key (it was written "
            "before the key was set, or changed by someone who may edit Airflow Variables): not used; "
            "running the job",
            name,
        )
        return None
    return entry


def write_entry(entry: CacheEntry) -> str:
    """Store ``entry`` (replacing any earlier one of its key); returns the Variable's name."""
    from airflow.sdk import Variable  # (as above)

    name = variable_name(entry.key)
    fields = entry.to_dict()
    secret = signing_key()
    if secret is not None:
        fields[_SIGNATURE] = _signature(secret, fields)
    Variable.set(
        name,
        json.dumps(fields, sort_keys=True),
        description=(
            f"kinetic-airflow result cache: tasks with cache=True and this key reuse the result of "
            f"job {entry.job_id} ({entry.dag_id}.{entry.task_id}, run {entry.run_id}). Delete it to run "
            "them fresh."
        ),
    )
    return name


def new_entry(key: str, ref: JobRef, result_sha256: str, usage: dict[str, Any] | None) -> CacheEntry:
    """The entry of a job that just delivered its result as a success."""
    identity = ref.job_identity
    usage = usage or {}
    return CacheEntry(
        key=key,
        job_id=ref.job_id,
        job_uri=ref.job_uri,
        backend=ref.backend,
        result_sha256=result_sha256,
        dag_id=identity.dag_id,
        run_id=identity.run_id,
        task_id=identity.task_id,
        map_index=int(identity.map_index),
        try_number=int(identity.try_number),
        accelerator=ref.accelerator or "cpu",
        chip_hours=float(usage.get("chip_hours") or 0.0),
        run_seconds=float(usage.get("run_seconds") or 0.0),
        created=time.time(),
    )


# A hit -----------------------------------------------------------------------------------------
def load_cached_envelope(storage: Storage, entry: CacheEntry) -> tuple[dict[str, Any], str]:
    """The earlier job's result envelope, checked against the entry's digest before it is
    unpickled (``IntegrityError`` when the stored envelope is not the one that was verified)."""
    uri = entry.result_uri
    source = f"the result cache entry {variable_name(entry.key)} (Airflow's metadata DB)"
    what = f"the cached result {uri}"
    envelope, sha256 = load_checked_envelope(
        storage, uri, lambda actual: check_digest(actual, entry.result_sha256, what, source)
    )
    check_envelope_format(envelope, uri)
    if not (isinstance(envelope, dict) and envelope.get("ok") is True):
        raise KineticJobError(f"the cached result {uri} is not a success")  # never entered as one
    return envelope, sha256


# The worker's steps ----------------------------------------------------------------------------
class Lookup:
    """One task instance's look at the cache before its job would be created (``JobDriver``).

    ``storage_for(uri)`` opens job storage with the task's connection; ``now`` is the try
    (``lifecycle.TryInfo``). ``key`` is the key looked up, once ``reuse`` computed it.
    """

    def __init__(
        self,
        task: Any,
        context: Any,
        store: Any,
        storage_for: Callable[[str], Storage],
        now: Any,
        *,
        dag_file: str | None,
        dags_folder: str | None,
    ) -> None:
        self.task = task
        self.context = context
        self.store = store
        self.storage_for = storage_for
        self.now = now
        self.dag_file = dag_file
        self.dags_folder = dags_folder
        self.keys: list[str] = []  # the keys looked up (one a rung of a capacity ladder)
        self.parts: PayloadParts | None = None  # the payload's parts as the look-up prepared them

    def _other_rungs(self, ref: JobRef) -> list[JobRef]:
        """The jobs the other rungs of the task's capacity ladder would run (none without one)."""
        ladder = getattr(self.task, "ladder", None) or []
        others = []
        for index in range(1, len(ladder)):
            try:
                others.append(self.task._rung_job_ref(ref.job_identity, ref.base_uri, index))
            except Exception as exc:  # that rung cannot be looked up; the others still can
                self.task.log.warning("[kinetic] cache: not looking up rung %d: %s", index + 1, exc)
        return others

    def reuse(self, ref: JobRef, deadline: float | None, record: Any) -> tuple[bool, Any]:
        """On a hit (its result verified against the entry): record the reuse (phase ``reused``),
        push XCom ``kinetic_cache``, log which job was reused and what it saved, and return
        ``(True, value)``. A miss, an unreadable index or a refused result: ``(False, None)``."""
        task = self.task
        fresh = fresh_run_reason(self.context, task.task_id)
        if fresh:
            task.log.info(
                "[kinetic] cache: not reusing a result (%s); the job's result replaces the entry", fresh
            )
            return False, None
        keys, self.parts = lookup_key(
            ref,
            self.storage_for(ref.job_uri),
            python_callable=task.python_callable,
            op_args=task.op_args,
            op_kwargs=task.op_kwargs,
            volumes=task.volumes,
            capture_env_vars=task.capture_env_vars,
            dag_file=self.dag_file,
            dags_folder=self.dags_folder,
            cache_version=task.cache_version,
            task_label=f"task {task.task_id!r}",
            others=self._other_rungs(ref),
        )
        self.keys = keys
        signing_key()  # a bad [kinetic] cache_signing_key fails the task here, naming the fix
        entry = None
        try:
            for key in keys:  # a ladder's rungs in order: a result of any of them will do
                entry = read_entry(key, task.log)
                if entry is not None:
                    break
        except Exception as exc:  # the index is a convenience: the job can still run
            task.log.warning("[kinetic] cache: could not read the result cache (%s); running the job", exc)
            return False, None
        if entry is None:
            task.log.info("[kinetic] cache: no earlier result with key %s; running the job", ", ".join(keys))
            return False, None
        try:
            envelope, sha256 = load_cached_envelope(self.storage_for(entry.job_uri), entry)
        except Exception as exc:  # IntegrityError: replaced after it was verified; or gone
            task.log.error(
                "[kinetic] cache: refused the cached result of job %s (%s); running a new job instead",
                entry.job_id,
                exc,
            )
            return False, None
        value = to_xcom(
            envelope["value"],
            entry.result_uri,
            multiple_outputs=bool(task.multiple_outputs),
            max_bytes=int(resolve_setting("xcom_max_bytes")),
            sha256=sha256,
        )
        reused = {
            "job_id": entry.job_id,
            "dag_id": entry.dag_id,
            "run_id": entry.run_id,
            "task_id": entry.task_id,
            "map_index": entry.map_index,
            "try_number": entry.try_number,
            "chip_hours_saved": entry.chip_hours,
            "run_seconds_saved": entry.run_seconds,
            "cache_key": key,
            "variable": variable_name(key),
        }
        usage = reused_usage(ref, entry.job_id)
        save_record(
            self.store,
            Phase.REUSED,
            job=ref,
            now=self.now,
            deadline=deadline,
            previous=record,
            outcome=EVENT_SUCCESS,
            usage=usage,
            reused=reused,
        )
        ti = self.context["ti"]
        ti.xcom_push(key=CACHE_XCOM_KEY, value={"reused": True, **reused})
        ti.xcom_push(key=USAGE_XCOM_KEY, value=totals([usage]))
        task.log.info(
            "[kinetic] cache: %s. No job was launched. To run it fresh, trigger the DAG with conf "
            '{"%s": true}, change cache_version, or delete the Variable %s.',
            reuse_words(reused),
            FRESH_RUN_CONF,
            reused["variable"],
        )
        return True, value


def reuse_words(reused: dict[str, Any]) -> str:
    """The words the log and the view say of a reuse: "reused the result of job X from run Y ..."."""
    chip_hours = float(reused.get("chip_hours_saved") or 0.0)
    seconds = float(reused.get("run_seconds_saved") or 0.0)
    return (
        f"reused the result of job {reused.get('job_id')} from run {reused.get('run_id')} "
        f"(task {reused.get('task_id')}, try {reused.get('try_number')}); saved {chip_hours:.4f} chip-hours "
        f"({seconds:.1f}s of job time)"
    )


def remember(
    task: Any,
    context: Any,
    store: Any,
    storage: Storage,
    ref: JobRef,
    job_key: str,
    result_sha256: str,
    *,
    looked_up: Sequence[str] = (),
) -> None:
    """Enter a job's delivered, verified result (``result_sha256``), keyed by its HMAC-checked
    manifest; push XCom ``kinetic_cache``. Never fails the task: its result is delivered."""
    try:
        record = load_record(store)
        usage = record.usage if record is not None and record.job.job_id == ref.job_id else None
        key = key_of_manifest(ref, storage, job_key, task.cache_version)
        name = write_entry(new_entry(key, ref, result_sha256, usage))
        if looked_up and key not in looked_up:
            log.warning(
                "kinetic cache: the payload shipped pickled differently from the one looked up (key %s, "
                "shipped %s): later runs may not reuse it; see how-to/cache.md",
                ", ".join(looked_up),
                key,
            )
        pushed = {"reused": False, "cache_key": key, "variable": name}
        context["ti"].xcom_push(key=CACHE_XCOM_KEY, value=pushed)
        task.log.info("[kinetic] cache: recorded the result of job %s as Variable %s", ref.job_id, name)
    except Exception as exc:
        task.log.warning("[kinetic] cache: could not record the result of job %s: %s", ref.job_id, exc)
