"""The resume hold against real processes: a finished job's event waits for the process that
deferred the task to be reaped by its parent (a zombie still counts as not reaped), then for the
margin; where that process cannot be seen, for the fixed bound."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kinetic_airflow.local_executor_watch import LocalExecutorWorker
from kinetic_airflow.resume_window import DeferringProcess, ProcessState, ResumeWindow
from kinetic_airflow.triggers import KineticJobTrigger


def _child(seconds: float) -> tuple[subprocess.Popen, DeferringProcess]:
    """A child process and its identity, as the child itself would have named it."""
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    me = DeferringProcess.this_process()
    assert me is not None, "this test needs Linux /proc"
    stat = open(f"/proc/{child.pid}/stat").read()
    ticks = int(stat[stat.rindex(")") + 1 :].split()[19])
    return child, dataclasses.replace(me, pid=child.pid, start_ticks=ticks)


def test_a_zombie_is_not_reaped_until_its_parent_waits() -> None:
    child, identity = _child(0.2)
    assert identity.state() is ProcessState.ALIVE
    deadline = time.monotonic() + 10
    while open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.05)
    assert identity.state() is ProcessState.ALIVE  # exited, but its exit not yet collected
    child.wait()
    assert identity.state() is ProcessState.REAPED


def test_a_reused_pid_is_not_the_deferring_process() -> None:
    child, identity = _child(30)
    try:
        assert (
            dataclasses.replace(identity, start_ticks=identity.start_ticks + 1).state() is ProcessState.REAPED
        )
    finally:
        child.kill()
        child.wait()


def test_a_trigger_run_by_the_deferring_process_itself_does_not_wait() -> None:
    """dag.test() runs the trigger inline, in the process that deferred: there is no executor
    event to wait for, and that process will not exit while it waits."""
    me = DeferringProcess.this_process()
    assert me is not None and me.state() is ProcessState.SELF
    started = time.monotonic()
    asyncio.run(ResumeWindow(me, not_before=time.time() + 60, margin=30).wait(print, "j"))
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("field", ["boot_id", "pid_namespace"])
def test_another_host_or_namespace_is_unobservable(field: str) -> None:
    me = DeferringProcess.this_process()
    assert me is not None
    assert dataclasses.replace(me, **{field: "elsewhere"}).state() is ProcessState.UNOBSERVABLE


def test_the_hold_ends_a_margin_after_the_reaping() -> None:
    child, identity = _child(0.5)
    lines: list[str] = []
    reaped_at: list[float] = []

    async def reap_later() -> None:
        await asyncio.sleep(1.5)  # the child has been a zombie for a second by now
        await asyncio.to_thread(child.wait)
        reaped_at.append(time.monotonic())

    async def scenario() -> float:
        reaper = asyncio.create_task(reap_later())
        await ResumeWindow(identity, not_before=time.time() + 60, margin=0.3).wait(lines.append, "j1")
        released = time.monotonic()
        await reaper
        return released

    released = asyncio.run(scenario())
    assert reaped_at and released >= reaped_at[0] + 0.3  # never before the reaping plus the margin
    assert released < reaped_at[0] + 10  # and not the fixed bound (60 s)
    assert any("once the process that deferred it (pid" in line for line in lines)


def test_a_reaping_seen_while_the_job_ran_costs_nothing_at_its_end() -> None:
    """The window is watched from the trigger's start: once the process has been reaped longer
    ago than the margin, a job ending then resumes at once (not after the margin, nor the bound)."""
    child, identity = _child(0.2)

    async def scenario() -> float:
        window = ResumeWindow(identity, not_before=time.time() + 60, margin=0.5)
        window.start()
        await asyncio.to_thread(child.wait)
        await asyncio.sleep(1.0)  # the job runs on past the reaping and the margin
        ended = time.monotonic()
        await window.wait(print, "j")
        window.stop()
        return time.monotonic() - ended

    assert asyncio.run(scenario()) < 0.2


def test_without_an_observable_process_the_fixed_bound_holds() -> None:
    me = DeferringProcess.this_process()
    assert me is not None
    elsewhere = dataclasses.replace(me, boot_id="another-host")
    for identity in (elsewhere, None):  # None: a trigger deferred by an older kinetic-airflow
        lines: list[str] = []
        started = time.time()
        asyncio.run(ResumeWindow(identity, not_before=started + 1.0, margin=0.0).wait(lines.append, "j"))
        assert time.time() >= started + 1.0
        assert any("cannot see the process" in line for line in lines)


def test_the_trigger_says_how_its_task_will_resume() -> None:
    child, identity = _child(30)
    try:
        seen = ResumeWindow(identity, not_before=None, margin=2).describe()
        assert seen == f"the task resumes once the process that deferred it (pid {child.pid}) has exited"
    finally:
        child.kill()
        child.wait()
    unseen = ResumeWindow(None, not_before=None, margin=2).describe()
    assert "cannot see the process that deferred it" in unseen


def test_older_trigger_kwargs_still_build_a_trigger() -> None:
    """A trigger row written before deferred_by existed is rebuilt after an upgrade."""
    old_kwargs = {"job": {"job_id": "j", "job_uri": "file:///tmp/j", "backend": "local"}, "not_before": 1.0}
    trigger = KineticJobTrigger(**old_kwargs)
    assert DeferringProcess.from_dict(trigger.deferred_by) is None
    me = DeferringProcess.this_process()
    assert me is not None
    _, kwargs = KineticJobTrigger(**old_kwargs, deferred_by=me.to_dict()).serialize()
    assert DeferringProcess.from_dict(kwargs["deferred_by"]) == me


# Under LocalExecutor: the scheduler's read of the exit event itself ----------------------------
def _local_executor_worker(results, control, identities) -> None:
    """A LocalExecutor worker in miniature, shaped as local_executor._run_worker is: titled for its
    workload, it runs the task process as its child, reaps it, posts the end event on the
    result queue when told to, and only then retitles itself idle."""
    from setproctitle import setproctitle

    setproctitle("airflow worker -- LocalExecutor: kn_dag/task/run/1")
    pid = os.fork()
    if pid == 0:  # the task process: names itself as the operator does, then "defers" (exits)
        identities.put(DeferringProcess.this_process())
        os._exit(0)
    os.waitpid(pid, 0)  # the supervisor reaps it
    control.get()  # "supervise() returns"
    results.put(("key", "success"))
    setproctitle("airflow worker -- LocalExecutor: <idle>")
    control.get()  # stay alive until the test is done


@contextlib.contextmanager
def _miniature_local_executor() -> Iterator[tuple[multiprocessing.Process, Any, Any, DeferringProcess]]:
    """The worker, its result queue, its control queue and the identity its task process sent."""
    context = multiprocessing.get_context("fork")
    results, control, identities = context.SimpleQueue(), context.SimpleQueue(), context.SimpleQueue()
    worker = context.Process(target=_local_executor_worker, args=(results, control, identities))
    worker.start()
    try:
        yield worker, results, control, identities.get()
    finally:
        control.put("post")  # harmless when it has posted already: it is waiting for "done"
        control.put("done")
        worker.join(10)


def test_under_local_executor_the_hold_ends_when_the_scheduler_has_read_the_event() -> None:
    with _miniature_local_executor() as (worker, results, control, identity):
        assert identity.worker is not None and identity.worker.pid == worker.pid
        kwargs = identity.to_dict()
        assert "LocalExecutor" not in json.dumps(kwargs)  # the title travels only as a digest
        identity = DeferringProcess.from_dict(kwargs)
        assert identity is not None and identity.worker is not None
        window = ResumeWindow(identity, not_before=time.time() + 60, margin=0.0)
        assert "once the scheduler has read the exit" in window.describe()
        lines: list[str] = []
        events: dict[str, float] = {}

        async def executor_and_scheduler() -> None:
            await asyncio.sleep(0.8)  # the task process is reaped; its event is not yet posted
            assert not identity.worker.posted()
            control.put("post")
            while not identity.worker.posted():
                await asyncio.sleep(0.02)
            events["posted"] = time.monotonic()
            await asyncio.sleep(0.8)  # posted, not yet read: still held
            assert identity.worker.unread_events() > 0
            events["read"] = time.monotonic()
            assert results.get() == ("key", "success")

        async def scenario() -> float:
            side = asyncio.create_task(executor_and_scheduler())
            await window.wait(lines.append, "j1")
            released = time.monotonic()
            await side
            return released

        released = asyncio.run(scenario())
        assert released >= events["read"] > events["posted"]
        assert released < events["read"] + 2  # the read ends the hold, not the fixed bound (60 s)
        assert any("once the scheduler has read the exit" in line for line in lines), lines
        assert any("the scheduler has read the exit" in line for line in lines[1:]), lines


def test_a_local_executor_worker_whose_queues_cannot_be_found_falls_back_to_the_margin() -> None:
    """Where the worker's queues are not found among its descriptors (another user's process, a
    hardened /proc, an executor of another shape), the reaping and the margin stand in for the
    read."""
    task, identity = _child(0.1)
    task.wait()
    worker, worker_identity = _child(30)  # alive, holds no pipe both ways, retitled (digest differs)
    try:
        seen = LocalExecutorWorker(pid=worker.pid, start_ticks=worker_identity.start_ticks, title_digest="x")
        assert seen.posted() and seen.unread_events() is None
        started = time.monotonic()
        lines: list[str] = []
        window = ResumeWindow(
            dataclasses.replace(identity, worker=seen), not_before=time.time() + 60, margin=0.5
        )
        asyncio.run(window.wait(lines.append, "j"))
        assert 0.5 <= time.monotonic() - started < 10, lines
        assert any(
            "once the exit of the process that deferred it has reached the scheduler" in x for x in lines
        )
    finally:
        worker.kill()
        worker.wait()


def test_a_worker_that_never_posts_is_waited_for_only_until_the_fixed_bound() -> None:
    with _miniature_local_executor() as (_worker, _results, _control, identity):
        lines: list[str] = []
        started = time.time()
        asyncio.run(ResumeWindow(identity, not_before=started + 1.5, margin=0.0).wait(lines.append, "j"))
        assert time.time() >= started + 1.5
        assert any("by the fixed bound" in line for line in lines), lines


def test_a_read_seen_while_the_job_ran_costs_nothing_when_the_worker_has_moved_on() -> None:
    """The scheduler's read is watched from the trigger's start. By the job's end the worker may
    supervise another task whose event sits unread in the same pipe; the read seen earlier
    still counts, so the job resumes at once instead of waiting for that other event's read."""
    with _miniature_local_executor() as (_worker, results, control, identity):
        window = ResumeWindow(identity, not_before=time.time() + 60, margin=0.0)

        async def scenario() -> float:
            window.start()
            control.put("post")
            while not identity.worker.posted():
                await asyncio.sleep(0.02)
            assert results.get() == ("key", "success")  # the scheduler reads the deferring exit
            await asyncio.sleep(1.0)  # the job runs on; the window sees the read
            results.put(("another task", "success"))  # the worker's next task ends, unread
            assert identity.worker.unread_events() > 0
            ended = time.monotonic()
            await window.wait(print, "j")
            window.stop()
            return time.monotonic() - ended

        assert asyncio.run(scenario()) < 0.2
