"""No lock is held across anything that can block or yield, and the triggerer's loop never waits on one.

Airflow 3.3's triggerer runs every trigger on one thread, under greenback: a synchronous call
that needs the supervisor (a connection or variable look-up) suspends its trigger and runs the
others meanwhile. A ``threading.Lock`` held across such a call deadlocks the loop as soon as
another trigger takes it — which is what three deferred GKE tasks did (issue 17). Two checks:

* a rule over the package's source: the body of every ``with <lock>:`` only touches memory
  (container methods, no await, no yield, no call into other code);
* the scenario itself, in process: several triggers of GKE and pathways jobs on the cluster
  emulator in one event loop, each under a greenback portal, with the cluster client's
  connection look-up suspending the way the supervisor's does (``greenback.await_`` on the
  loop's thread, ``run_coroutine_threadsafe`` from a worker thread — what
  ``TriggerCommsDecoder.send`` does). The old code deadlocked here; the real-components
  version with twenty tasks per backend is tests/test_triggerer_concurrency.py.
"""

from __future__ import annotations

import ast
import asyncio
import os
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import greenback
import pytest
from emulated_cluster import point_kinetic_at, running_emulator
from jobkit import gke_job

import kinetic_airflow
from kinetic_airflow.backends.gke import client as gke_client
from kinetic_airflow.job.ref import JobRef
from kinetic_airflow.triggers import KineticJobTrigger

cloudpickle.register_pickle_by_value(sys.modules[__name__])

PACKAGE = Path(kinetic_airflow.__file__).resolve().parent
# What a lock's body may call: methods of dicts, sets, lists and events that only touch memory.
MEMORY_ONLY = {
    "get", "pop", "popitem", "setdefault", "add", "discard", "remove", "append", "clear", "update", "copy",
    "items", "values", "keys", "list", "dict", "set", "tuple", "len", "sorted", "is_set",
    "monotonic", "id", "bool", "cluster_key", "move_to_end",
}  # fmt: skip

pytestmark = pytest.mark.timeout(300)


def _is_lock(expr: ast.expr) -> bool:
    name = expr.attr if isinstance(expr, ast.Attribute) else expr.id if isinstance(expr, ast.Name) else ""
    return name.lower().endswith("lock")


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else "?"


def _violations(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, (ast.With, ast.AsyncWith)):
            continue
        if not any(_is_lock(item.context_expr) for item in node.items):
            continue
        where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        if isinstance(node, ast.AsyncWith):
            continue  # an asyncio.Lock: awaiting under it is what it is for
        for inner in (n for stmt in node.body for n in ast.walk(stmt)):
            if isinstance(inner, (ast.Await, ast.Yield, ast.YieldFrom)):
                found.append(f"{where}: {type(inner).__name__.lower()} while holding a lock")
            elif isinstance(inner, ast.Call) and _called_name(inner) not in MEMORY_ONLY:
                found.append(f"{where}: calls {_called_name(inner)}() while holding a lock")
    return found


def test_no_lock_is_held_across_a_call_that_may_block_or_yield() -> None:
    files = [p for p in PACKAGE.rglob("*.py") if "testing" not in p.relative_to(PACKAGE).parts]
    locked = [p for p in files if "Lock()" in p.read_text()]
    assert locked, "the rule found no lock at all: it no longer looks where the locks are"
    violations = [v for p in files for v in _violations(p)]
    assert violations == [], "\n".join(violations)


def test_the_rule_catches_a_lock_held_across_a_call(tmp_path: Path) -> None:
    """The rule itself can fail: the shape of the old ``shared_watch`` is refused."""
    bad = PACKAGE / "_lock_rule_probe.py"
    bad.write_text(
        "import threading\n_LOCK = threading.Lock()\n"
        "def shared(cluster):\n    with _LOCK:\n        return make_client(cluster)\n"
    )
    try:
        assert _violations(bad) == [
            f"{PACKAGE.name}/_lock_rule_probe.py:4: calls make_client() while holding a lock"
        ]
    finally:
        bad.unlink()


# The scenario ---------------------------------------------------------------------------------
def _short_job(i: int) -> int:
    for n in range(3):
        print(f"job {i} line {n}", flush=True)
        time.sleep(0.5)
    return i * 10


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with running_emulator(tmp_path_factory) as pair:
        yield pair


def _suspending_lookups(monkeypatch: pytest.MonkeyPatch, loop_box: dict) -> list[str]:
    """Make building a cluster client suspend as a supervisor look-up does; returns who called it."""
    real = gke_client.api_server
    calls: list[str] = []

    def looked_up(cluster):
        loop = loop_box["loop"]
        if threading.get_ident() == loop_box["thread"]:
            calls.append("loop thread")
            greenback.await_(asyncio.sleep(0.2))
        else:
            calls.append("worker thread")
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0.2), loop).result(timeout=30)
        return real(cluster)

    monkeypatch.setattr(gke_client, "api_server", looked_up)
    return calls


def test_concurrent_triggers_with_suspending_connection_lookups_all_fire(
    emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, kubeconfig = emulator
    point_kinetic_at(cluster, kubeconfig, monkeypatch)
    monkeypatch.setenv("KINETIC_BASE_URI", f"file://{tmp_path}")
    refs = [gke_job(f"one-host-{i}", _short_job, [i])[1] for i in range(3)]
    refs += [
        gke_job(f"slice-{i}", _short_job, [10 + i], backend="pathways", accelerator="tpu-v6e-8")[1]
        for i in range(2)
    ]
    loop_box: dict = {}
    calls = _suspending_lookups(monkeypatch, loop_box)
    from kinetic_airflow.backends.gke.watch_cache import reset_shared_state

    reset_shared_state()  # every trigger must build its client afresh, as in a new triggerer
    events: dict[str, dict] = {}

    async def run_one(ref: JobRef) -> None:
        await greenback.ensure_portal()  # as TriggerRunner.run_trigger does
        async for event in KineticJobTrigger(job=ref.to_dict(), poll_interval=0.3).run():
            events[ref.job_id] = event.payload

    async def main() -> None:
        loop_box["loop"], loop_box["thread"] = asyncio.get_running_loop(), threading.get_ident()
        await asyncio.gather(*(run_one(ref) for ref in refs))

    runner = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    runner.start()
    runner.join(timeout=180)
    assert not runner.is_alive(), (
        f"the event loop is stuck: {len(events)} of {len(refs)} triggers fired; connection look-ups "
        f"made from: {calls}"
    )
    assert {job_id: e["status"] for job_id, e in events.items()} == {r.job_id: "success" for r in refs}
    assert calls and "loop thread" not in calls, calls
    assert os.environ["KINETIC_BASE_URI"].startswith("file://")
