"""The program that runs inside a job: fetch the payload, run the function, write the envelope.

Usage::

    python -m kinetic_airflow.runner --job-uri gs://bucket/kinetic/jobs/<job_id>

It imports only the standard library, cloudpickle and (for gs://) google-cloud-
storage, so the runner image needs no Airflow. The order of its steps is the
contract the trigger relies on: ``status/started.json`` first, heartbeats while
the function runs, ``result.pkl`` then ``result.json`` (the JSON's presence
means the result is complete), then ``status/finished.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

import cloudpickle

from kinetic_airflow import __version__
from kinetic_airflow.job.codebundle import install_code_bundle, unpacked_sources
from kinetic_airflow.job.debugging import wait_for_debugger
from kinetic_airflow.job.envelope import (
    FORMAT_VERSION,
    RERUN_REFUSED_EXIT,
    ResultRef,
    dump_envelope,
    dumps_summary,
    is_result_ref,
    replace_refs,
)
from kinetic_airflow.job.inputs import Data, mount
from kinetic_airflow.job.integrity import (
    KEY_ENV,
    HashingFile,
    IntegrityError,
    check_digest,
    hide_key_from_environ,
    result_tag,
    take_key,
    verify_manifest,
)
from kinetic_airflow.job.interop import write_kinetic_result
from kinetic_airflow.job.layout import PAYLOAD_NAME, RESULT_NAME, JobLayout
from kinetic_airflow.job.metrics import MetricsWriter, flush_on_termination, start_for_job
from kinetic_airflow.job.multihost import multislice_host_index
from kinetic_airflow.job.requirements import InstallError, ensure_environment
from kinetic_airflow.job.stop import function_finished, request_stop, stop_requested
from kinetic_airflow.job.storage import Storage, open_storage, uri_to_local_path
from kinetic_airflow.job.tracebacks import mark_traceback, user_names

__all__ = ["main"]

_LOG_PREFIX = "[kinetic]"


def log(message: str) -> None:
    # One write, line included: a signal handler's line may come between two writes of print().
    sys.stderr.write(f"{_LOG_PREFIX} {message}\n")
    sys.stderr.flush()


# Airflow's own code a job reaches when the function asks for a Variable or a Connection.
_AIRFLOW_ACCESS_FRAMES = (
    ("airflow/sdk/execution_time/context.py", ("_get_variable", "_get_connection")),
    ("airflow/sdk/definitions/variable.py", ()),
    ("airflow/sdk/definitions/connection.py", ()),
    ("airflow/models/variable.py", ()),
    ("airflow/models/connection.py", ()),
)


def airflow_access_hint(exc: BaseException) -> str | None:
    """Why a Variable or Connection lookup failed inside a job, and what to do instead.

    The job runs outside Airflow (no metadata database, no task API), so those lookups fail
    with whatever Airflow's fallback meets (an unparseable database URL, a missing variable):
    an error that says nothing of why.
    """
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        path = frame.f_code.co_filename.replace(os.sep, "/")
        for suffix, functions in _AIRFLOW_ACCESS_FRAMES:
            if path.endswith(suffix) and (not functions or frame.f_code.co_name in functions):
                return (
                    "kinetic: Airflow Variables and Connections cannot be read inside a kinetic job: it runs "
                    "outside Airflow, with no metadata database or task API. Read the value where the task "
                    "is defined and pass it as an argument, e.g. a templated one: "
                    'train(lr="{{ var.value.learning_rate }}"). Give a job a secret through a Kubernetes '
                    "Secret (pod_override), never as an argument: arguments are stored with the job."
                )
    return None


class PhaseError(Exception):
    """A failure of the runner's own steps (not the user's function)."""


def _now() -> float:
    return time.time()


def _host_index(explicit: int | None) -> int:
    if explicit is not None:
        return explicit
    across_slices = multislice_host_index()  # before TPU_WORKER_ID: that counts within a slice
    if across_slices is not None:
        return across_slices
    for name in ("KINETIC_HOST_INDEX", "TPU_WORKER_ID", "LWS_WORKER_INDEX", "JOB_COMPLETION_INDEX"):
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 0


def _qualname(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _timings_text(timings: dict[str, float]) -> str:
    """``runner start to result stored: download 0.1s, execute 2.1s, upload 9.4s``."""
    steps = [(k, v) for k, v in timings.items() if k != "total" and not k.startswith("install_")]
    return "runner start to result stored: " + ", ".join(f"{k} {v:.1f}s" for k, v in steps)


def _safe_repr(obj: Any, limit: int = 500) -> str:
    try:
        text = repr(obj)
    except Exception as exc:  # repr itself may be broken in user classes
        text = f"<{_qualname(obj)} (repr failed: {exc})>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Heartbeat(threading.Thread):
    """Rewrites the heartbeat marker so observers can tell a live job from a lost node."""

    def __init__(self, storage: Storage, uri: str, period: float, host: int) -> None:
        super().__init__(name="kinetic-heartbeat", daemon=True)
        self.storage, self.uri, self.period, self.host = storage, uri, period, host
        self.stop_event = threading.Event()

        self.beats = 0

    def start(self) -> None:
        """The first beat is written before the function runs, however short it is."""
        self.beat()
        super().start()

    def beat(self) -> None:
        self.beats += 1
        try:
            self.storage.write_text(
                self.uri, json.dumps({"time": _now(), "beat": self.beats, "host": self.host})
            )
        except Exception as exc:  # a missed beat must never kill the job
            log(f"heartbeat write failed: {exc}")

    def run(self) -> None:
        while not self.stop_event.wait(self.period):
            self.beat()


class JobRunner:
    def __init__(self, job_uri: str, host: int, heartbeat_seconds: float | None) -> None:
        self.layout = JobLayout(job_uri.rstrip("/"))
        self.storage = open_storage(job_uri)
        self.host = host
        self.heartbeat_seconds = heartbeat_seconds
        self.timings: dict[str, float] = {}
        self.started = _now()  # reset by run()
        self.phase = "download"
        self.manifest: dict[str, Any] = {}
        self.workdir = tempfile.mkdtemp(prefix="kinetic-job-")
        self.post_mortem = False  # --pdb
        self.code_sources: dict[str, str] = {}  # unpacked DAG bundle folder -> its path on the worker
        # The job's key (the docs' security model): out of band, never from job storage. Taken
        # out of the environment so the user's function and its subprocesses do not inherit it.
        self.key = take_key()
        self.key_source = os.environ.get("KINETIC_JOB_KEY_SOURCE") or f"${KEY_ENV}"

    # Markers ------------------------------------------------------------------------------
    def marker(self, name: str, **extra: Any) -> None:
        record = {"time": _now(), "host": self.host, "pid": os.getpid(), "hostname": socket.gethostname()}
        if os.environ.get("KINETIC_POD_UID"):
            record["pod_uid"] = os.environ["KINETIC_POD_UID"]
        record.update(extra)
        try:
            self.storage.write_text(self.layout.status(name, self.host), json.dumps(record))
        except Exception as exc:
            log(f"could not write the {name} marker: {exc}")

    def _timed(self, phase: str) -> _PhaseTimer:
        self.phase = phase
        return _PhaseTimer(self.timings, phase)

    # Steps --------------------------------------------------------------------------------
    def _wait_for_manifest(self) -> str:
        """The job is created before its payload is uploaded: wait for the manifest (written last)."""
        limit = float(os.environ.get("KINETIC_PAYLOAD_WAIT_SECONDS", "600"))
        deadline = time.monotonic() + limit
        delay = 0.1
        while True:
            text = self.storage.read_text_or_none(self.layout.manifest)
            if text is not None:
                return text
            if time.monotonic() > deadline:
                raise PhaseError(
                    f"the job's payload did not arrive at {self.layout.job_uri} within {limit:.0f}s: the "
                    "Airflow worker that created the job failed to upload it (see that task's log)"
                )
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def load_payload(self) -> dict[str, Any]:
        with self._timed("download"):
            manifest_text = self._wait_for_manifest()
        with self._timed("verify"):
            # Nothing in the manifest is used before its HMAC is checked with the job's key.
            try:
                self.manifest = verify_manifest(
                    manifest_text, self.key, self.layout.manifest, self.key_source
                )
            except IntegrityError as exc:
                raise PhaseError(str(exc)) from None
        with self._timed("download"):
            local_payload = os.path.join(self.workdir, PAYLOAD_NAME)
            payload_sha256 = self.storage.download_hashed(self.layout.payload, local_payload)
        with self._timed("verify"):
            try:
                check_digest(
                    payload_sha256,
                    self.manifest.get("sha256"),
                    f"the payload {self.layout.payload}",
                    f"the manifest (HMAC-checked with the job key from {self.key_source})",
                )
            except IntegrityError as exc:
                raise PhaseError(
                    f"payload digest mismatch: {exc} Re-run the task to upload it again."
                ) from None
            client = self.manifest.get("fingerprint", {})
            self._check_release(client)
            client_py = str(client.get("python", ""))
            here_py = platform.python_version()
            if client_py.split(".")[:2] != here_py.split(".")[:2]:
                raise PhaseError(
                    f"Python version mismatch: the payload was pickled on Python {client_py} but this job "
                    f"runs Python {here_py}. cloudpickle needs the same major.minor version on both sides: "
                    f"use a runner image with Python {'.'.join(client_py.split('.')[:2])} "
                    "(container_image=...) or run Airflow on the job's Python version."
                )
            if str(client.get("cloudpickle", "")).split(".")[:1] != cloudpickle.__version__.split(".")[:1]:
                log(
                    f"warning: cloudpickle {client.get('cloudpickle')} pickled this payload, the job has "
                    f"{cloudpickle.__version__}; install the same major version in the image if it fails"
                )
        with self._timed("install"):
            self._install_requirements()
        with self._timed("code"):
            self._install_code()
        with self._timed("unpickle"), open(local_payload, "rb") as fh:
            try:
                payload = cloudpickle.load(fh)
            except ModuleNotFoundError as exc:
                raise PhaseError(
                    self._missing_module(exc, "unpickling the function and its arguments")
                ) from exc
        os.unlink(local_payload)
        return payload

    def _check_release(self, client: dict[str, Any]) -> None:
        """The worker's kinetic-airflow against this runner's.

        A different job-file format fails the job here, before anything of the payload is
        unpickled, with both releases named: the envelope this runner would write could not be
        read by that worker. The same format from another release is a warning in the job log
        (which the task log shows), not a failure: releases that keep the format work together,
        and an upgrade of the workers must not fail every job until each image is rebuilt.
        """
        theirs = str(client.get("kinetic_airflow") or "an older release (no version in its manifest)")
        their_format = client.get("format", 1)  # manifests written before the field existed: 1
        image = self.manifest.get("image") or "this job's image"
        rebuild = (
            f"rebuild the runner image with the workers' kinetic-airflow (kinetic-airflow image --kind KIND "
            f"--python {'.'.join(str(client.get('python', '')).split('.')[:2]) or 'X.Y'}, then push it) or "
            "point container_image at an image built for it"
        )
        if their_format != FORMAT_VERSION:
            raise PhaseError(
                f"job format mismatch: the Airflow worker (kinetic-airflow {theirs}) wrote job format "
                f"{their_format}, but the runner in {image} (kinetic-airflow {__version__}) reads format "
                f"{FORMAT_VERSION}; {rebuild}"
            )
        if client.get("kinetic_airflow") != __version__:
            log(
                f"warning: version mismatch: the Airflow worker runs kinetic-airflow {theirs}, the runner "
                f"in {image} is kinetic-airflow {__version__} (same job format {FORMAT_VERSION}, so the job "
                f"runs); to keep them in step, {rebuild}"
            )

    def _install_requirements(self) -> None:
        """The job's extra packages, from the environment cache (installed there if need be)."""
        lines = self.manifest.get("requirements") or []
        if not lines:
            return
        cache = os.environ.get("KINETIC_ENV_CACHE") or os.path.expanduser("~/.cache/kinetic/envs")
        try:
            path, installed, seconds = ensure_environment(lines, cache, log)
        except InstallError as exc:
            raise PhaseError(str(exc)) from None
        self.timings["install_seconds"] = round(seconds, 3)
        self.timings["install_cached"] = 0.0 if installed else 1.0
        sys.path.insert(0, path)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")]))

    def _install_code(self) -> None:
        """The DAG bundle's own code, on sys.path before anything is unpickled."""
        entry = self.manifest.get("code")
        if not entry:
            return
        try:
            paths = install_code_bundle(self.storage, entry, self.workdir)
        except ValueError as exc:
            raise PhaseError(str(exc)) from None
        for path in reversed(paths):
            sys.path.insert(0, path)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")]))
        self.code_sources = unpacked_sources(entry, self.workdir)

    def _missing_module(self, exc: ModuleNotFoundError, doing: str) -> str:
        """Which module, where the job ran, and the two ways to get it there."""
        module = exc.name or str(exc)
        where = f"{self.manifest.get('backend') or 'this'} job"
        image = self.manifest.get("image")
        if image:
            where += f" on image {image}"
        return (
            f"module {module!r} is not installed in the {where} (while {doing}). Add it with "
            f"requirements=[{module.split('.')[0]!r}] on the task, or use a container_image that has it."
        )

    def setup(self, payload: dict[str, Any]) -> tuple[Any, list[Any], dict[str, Any]]:
        with self._timed("setup"):
            env = payload.get("env") or {}
            os.environ.update({k: str(v) for k, v in env.items()})
            output_dir = self.manifest.get("output_dir")
            if output_dir:
                if output_dir.startswith("file://"):
                    output_dir = uri_to_local_path(output_dir)
                    os.makedirs(output_dir, exist_ok=True)
                os.environ["KINETIC_OUTPUT_DIR"] = output_dir
            os.environ["KINETIC_JOB_ID"] = str(self.manifest.get("job_id", ""))
            os.environ["KINETIC_HOST_INDEX"] = str(self.host)
            os.environ["KINETIC_ATTEMPT"] = str(self.manifest.get("attempt", 1))
            os.environ["KINETIC_TRY_NUMBER"] = str((self.manifest.get("identity") or {}).get("try_number", 1))
            data_root = os.path.join(self.workdir, "data")
            for mount_path, data in (payload.get("volumes") or {}).items():
                local = data.materialize(data_root)
                mount(local, mount_path)
                log(f"volume {data.source} available at {mount_path}")

            def resolve(obj: Any) -> Any:
                if isinstance(obj, Data):
                    return obj.materialize(data_root)
                return obj

            def load_ref(ref: Any) -> Any:
                ref = ResultRef.from_xcom(ref) if is_result_ref(ref) else ref
                log(f"loading upstream result {ref!r}")
                return ref.load()

            args = [resolve(replace_refs(a, load_ref)) for a in payload.get("args", ())]
            kwargs = {k: resolve(replace_refs(v, load_ref)) for k, v in (payload.get("kwargs") or {}).items()}
            return payload["fn"], args, kwargs

    # The whole job ------------------------------------------------------------------------
    def run(self) -> int:
        started = self.started = _now()
        self.marker("started")
        heartbeat = None
        metrics: MetricsWriter | None = None
        envelope: dict[str, Any] = {"ok": False, "host": self.host, "value": None, "exception": None}
        try:
            payload = self.load_payload()
            self.heartbeat_seconds = self.heartbeat_seconds or float(
                self.manifest.get("heartbeat_seconds") or 30
            )
            heartbeat = _Heartbeat(
                self.storage, self.layout.status("heartbeat", self.host), self.heartbeat_seconds, self.host
            )
            heartbeat.start()
            fn, args, kwargs = self.setup(payload)
            metrics = start_for_job(
                self.storage, self.layout, self.host, float(self.manifest.get("metrics_interval") or 5.0)
            )
            wait_for_debugger(self, fn, log)  # debug=True: debugpy, bounded wait for a client
            name = getattr(fn, "__qualname__", None) or _qualname(fn)
            log(f"running {name} (job {self.manifest.get('job_id')}, host {self.host})")
            with self._timed("execute"):
                try:
                    value = fn(*args, **kwargs)
                except SystemExit as exc:
                    if exc.code in (0, None):
                        value = None
                    else:
                        raise
                finally:
                    if stop_requested():  # said before the kinetic-stop thread may end the process
                        log("the function ended after the stop was asked; no result is written")
                    function_finished()  # a stop in progress need not wait for it any longer
            envelope.update(ok=True, value=value)
        except BaseException as exc:
            if self.post_mortem and self.phase == "execute":  # kinetic-airflow reproduce --pdb
                # Only for --pdb.
                import pdb

                pdb.post_mortem(exc.__traceback__)
            if isinstance(exc, ModuleNotFoundError) and self.phase == "execute":
                exc.add_note(self._missing_module(exc, "running the function"))
            envelope.update(self._failure(exc))
        finally:
            if heartbeat is not None:
                heartbeat.stop_event.set()
            if metrics is not None and not stop_requested():  # the last points go before the result
                metrics.close()
        if stop_requested():
            # Asked to stop (cancel, timeout, preemption): the job ends as stopped, with no result,
            # whatever the function did in its grace period. The kinetic-stop thread flushes the
            # metrics once the stop hooks are done too, and ends the process.
            threading.Event().wait()
        envelope["timings"] = {**self.timings, "total": round(_now() - started, 3)}
        envelope["fingerprint"] = {
            "python": platform.python_version(),
            "hostname": socket.gethostname(),
            "kinetic_airflow": __version__,
            "format": FORMAT_VERSION,
        }
        envelope["attempt"] = self.manifest.get("attempt", 1)
        written = self.write_envelope(envelope)
        if written:  # kinetic's own format beside its handle.json, for `kinetic jobs result`
            write_kinetic_result(self.storage, self.layout.job_uri, self.host, envelope)
        self.marker("finished", ok=envelope["ok"] and written)
        if envelope["ok"] and written:
            # The same span as the usage line's run time (started to finished marker): the upload
            # of a large result is part of it, so say how it splits.
            log(f"finished in {envelope['timings']['total']:.1f}s ({_timings_text(envelope['timings'])})")
            return 0
        log(f"failed in phase {envelope.get('phase')}: {envelope.get('error_message')}")
        return 1

    def _failure(self, exc: BaseException) -> dict[str, Any]:
        phase = self.phase
        if isinstance(exc, SystemExit):
            message = (
                f"the function called sys.exit({exc.code!r}). Only sys.exit(0) counts as success; "
                "return a value or raise an exception to report an error."
            )
        elif isinstance(exc, PhaseError):
            message = str(exc)
        else:
            message = _safe_repr(exc, 2000) if not str(exc) else str(exc)
            message = "\n".join([message, *getattr(exc, "__notes__", ())])
        hint = airflow_access_hint(exc)
        if hint:
            message = f"{message}\n{hint}"
            exc.add_note(hint)
        # Names as the user wrote them, not Airflow's generated DAG-file module names; files of
        # the DAG bundle where they are on the worker, not in this job's temporary folder.
        tb = user_names("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        for unpacked, original in self.code_sources.items():
            tb = tb.replace(unpacked + os.sep, original + os.sep)
        sys.stderr.write(mark_traceback(tb))  # the task log shows it once, before the task's error
        return {
            "ok": False,
            "phase": phase,
            "exception": None if isinstance(exc, PhaseError) else exc,
            "error_type": "kinetic.PhaseError" if isinstance(exc, PhaseError) else user_names(_qualname(exc)),
            "error_message": user_names(message),
            "traceback": tb,
            "exit_code": exc.code if isinstance(exc, SystemExit) else None,
        }

    def write_envelope(self, envelope: dict[str, Any]) -> bool:
        """Pickle and upload; an unpicklable value or exception still leaves an envelope."""
        if self.host != 0 and envelope["ok"]:
            return True  # only the leader reports a success; workers report only their failures
        self.phase = "upload"
        if envelope["ok"]:
            envelope["value_type"] = _qualname(envelope["value"])
            envelope["value_repr"] = _safe_repr(envelope["value"])
        local = os.path.join(self.workdir, RESULT_NAME)
        try:
            with open(local, "wb") as fh:
                sink = HashingFile(fh)
                dump_envelope(envelope, sink)
        except Exception as exc:
            what = "return value" if envelope["ok"] else "exception"
            obj = envelope["value"] if envelope["ok"] else envelope["exception"]
            log(f"the {what} cannot be pickled: {exc}")
            if envelope["ok"]:
                envelope.update(
                    ok=False,
                    phase="upload",
                    error_type="kinetic.UnpicklableResult",
                    error_message=(
                        f"the function returned a {_qualname(obj)} that cannot be pickled ({exc}); "
                        f"repr: {_safe_repr(obj)}. Return plain data (numbers, lists, dicts, arrays) "
                        "or save the object to KINETIC_OUTPUT_DIR and return its path."
                    ),
                    traceback="",
                )
            else:
                envelope["error_message"] = (
                    f"{envelope.get('error_message')} (the {_qualname(obj)} exception itself could not be "
                    f"pickled: {exc}; repr: {_safe_repr(obj)})"
                )
            envelope.update(value=None, exception=None)
            with open(local, "wb") as fh:
                sink = HashingFile(fh)
                dump_envelope(envelope, sink)
        self._sign(envelope, sink.hexdigest())
        try:
            with _PhaseTimer(self.timings, "upload"):
                self.storage.upload_file(local, self.layout.result(self.host))
            envelope["timings"]["upload"] = self.timings["upload"]
            # result.json's total: from the runner's start to the result stored, upload included
            envelope["timings"]["total"] = round(_now() - self.started, 3)
            self.storage.write_text(self.layout.result_summary(self.host), dumps_summary(envelope))
        except Exception as exc:
            log(f"could not upload the result envelope to {self.layout.result(self.host)}: {exc}")
            return False
        finally:
            if os.path.exists(local):
                os.unlink(local)
        return True

    def _sign(self, envelope: dict[str, Any], sha256: str) -> None:
        """result.json vouches for result.pkl: its digest, and an HMAC of (host, digest) under the job
        key, which the worker checks before it unpickles anything (without a key: no HMAC, and the
        worker refuses the result)."""
        integrity: dict[str, Any] = {"sha256": sha256, "host": self.host}
        if self.key:
            integrity["hmac"] = result_tag(self.key, self.host, sha256)
        envelope["integrity"] = integrity


class _PhaseTimer:
    def __init__(self, timings: dict[str, float], phase: str) -> None:
        self.timings, self.phase = timings, phase

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *_: Any) -> None:
        self.timings[self.phase] = round(time.perf_counter() - self.start, 3)


def _install_sigterm_marker(runner: JobRunner) -> None:
    """On SIGTERM (a cancel, ``execution_timeout``, mark failed, a preemption): tell the function
    (``kinetic_airflow.stop_requested()``, its ``on_stop`` hooks), give it the job's
    ``stop_grace_seconds``, flush the reported metrics, then end of SIGTERM as before.

    The handler itself only sets the flag and starts the ``kinetic-stop`` thread (``job.stop``
    says why the hooks do not run here, in the main thread)."""

    def handler(signum: int, _frame: Any) -> None:
        if stop_requested():  # a second SIGTERM (the group's and the supervisor's): one stop
            return
        log(f"received signal {signum}; asking the function to stop")

        def record() -> None:
            runner.marker("terminated", signal=signum)

        def finish() -> None:
            # A preempted attempt's curve keeps its last interval: the next attempt continues it.
            flush_on_termination()
            log(f"stopping (signal {signum})")
            sys.stdout.flush()
            sys.stderr.flush()
            _die_of(signum)

        # No grace in the manifest (made by an earlier version, or not read yet: the function has
        # not started): the backend gives none either, so end at once as before.
        grace = runner.manifest.get("stop_grace_seconds") if isinstance(runner.manifest, dict) else None
        request_stop(float(grace) if isinstance(grace, (int, float)) else 0.0, record, finish)

    signal.signal(signal.SIGTERM, handler)


def _die_of(signum: int) -> None:
    """End the process of ``signum`` from any thread, as if no handler were installed: watchers
    read a stop from the exit (143 in a pod, -15 for the local supervisor). ``signal.signal``
    works only in the main thread, which may be inside the function: reset the C-level
    disposition instead."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signum, None)  # SIG_DFL is 0
        os.kill(os.getpid(), signum)
        time.sleep(5)
    finally:
        os._exit(128 + signum)  # what a shell reports for a death of that signal


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kinetic_airflow.runner",
        description=(
            "Run one kinetic-airflow job: download and verify the payload under JOB_URI, run the "
            "function, and write the result envelope and status markers back to JOB_URI. Needs only "
            "cloudpickle and google-cloud-storage (no Airflow)."
        ),
    )
    parser.add_argument(
        "--job-uri",
        required=True,
        help="the job's storage prefix, gs://bucket/.../jobs/<job_id> or file:///.../jobs/<job_id>",
    )
    parser.add_argument(
        "--host-index",
        type=int,
        default=None,
        help="this host's index in a multi-host job (default: $TPU_WORKER_ID / $LWS_WORKER_INDEX / 0); "
        "only host 0 writes the result, other hosts write only their failures",
    )
    parser.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=None,
        help="period of the heartbeat marker (default: the manifest's value, else 30)",
    )
    parser.add_argument(
        "--pdb",
        action="store_true",
        help="if the function raises, open pdb at the exception (post mortem) before the result is "
        "written; for a local reproduction (kinetic-airflow reproduce --pdb), not for jobs",
    )
    return parser


def _already_ran(runner: JobRunner) -> dict[str, Any] | None:
    """This host's ``started`` marker of this attempt, if its runner has run here before.

    A multi-host pod restarts its container whenever the runner ends (``restartPolicy:
    Always`` is the only one LWS allows). A single-host Job (``backoffLimit: 0``) starts a
    second pod only after it was suspended and resumed: Kueue evicting the Workload
    (preemption) and admitting it again. Either way running the function again would run this
    attempt twice (and on one host alone hang in the collectives); the attempt's outcome is
    decided by what the first run wrote or by kinetic starting the next attempt.
    """
    text = runner.storage.read_text_or_none(runner.layout.status("started", runner.host))
    return json.loads(text) if text else None


def _refuse_rerun(runner: JobRunner, earlier: dict[str, Any]) -> int:
    """A resumed single-host Job: end at once (no user code), so the Job fails with a code that
    says why and the watcher starts the next attempt from the checkpoint."""
    pod = earlier.get("hostname") or earlier.get("pod_uid") or "?"
    log(
        f"this attempt's function already ran in pod {pod}; "
        "the Job was stopped and resumed (a Kueue eviction): not running it twice. "
        "kinetic starts the next attempt."
    )
    shutil.rmtree(runner.workdir, ignore_errors=True)
    return RERUN_REFUSED_EXIT


def _stop_rerun_on_a_host(runner: JobRunner, earlier: dict[str, Any]) -> int:
    """A multi-host runner that finds its host's function already run in this attempt.

    Restarted in the same pod (its container ended; ``restartPolicy: Always``): wait to be
    stopped, so the pod's ``lastState`` keeps the first run's exit, which decides the attempt.
    In a replacement pod (the first was preempted or deleted, and the StatefulSet recreated it
    under the same name): end with ``RERUN_REFUSED_EXIT``, which the pod's status keeps, so any
    watcher learns the host was lost at once, also one that never saw the first pod's uid (a
    trigger started after the replacement) and would otherwise wait for a stale heartbeat.
    """
    same_pod = earlier.get("pod_uid") and earlier.get("pod_uid") == os.environ.get("KINETIC_POD_UID")
    shutil.rmtree(runner.workdir, ignore_errors=True)
    if not same_pod:
        log(
            f"host {runner.host} already ran this attempt's function in an earlier pod (this one "
            "replaced it); not running it again: the host was lost, kinetic starts the next attempt."
        )
        return RERUN_REFUSED_EXIT
    log(
        f"host {runner.host} already ran this attempt's function in this pod; not running it again. "
        "Waiting for the attempt's LeaderWorkerSet to be deleted."
    )
    while True:
        signal.pause()


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a job process (not a test calling main): no environment may hold the key
        hide_key_from_environ(sys.orig_argv)
    args = build_parser().parse_args(argv)
    runner = JobRunner(args.job_uri, _host_index(args.host_index), args.heartbeat_seconds)
    runner.post_mortem = args.pdb
    earlier = _already_ran(runner)
    if earlier is not None:
        if int(os.environ.get("KINETIC_NUM_HOSTS") or 1) > 1:
            return _stop_rerun_on_a_host(runner, earlier)
        return _refuse_rerun(runner, earlier)
    _install_sigterm_marker(runner)
    code = runner.run()
    sys.stdout.flush()
    sys.stderr.flush()
    # The result is uploaded: the downloaded payload and staged data are not needed any more.
    shutil.rmtree(runner.workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    # os._exit: the result is written, so lingering non-daemon threads the user started
    # must not keep the job (and its accelerators) alive.
    os._exit(main())
