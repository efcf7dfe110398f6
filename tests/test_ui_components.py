"""Following a sweep from Airflow's UI: the api-server with the Kinetic plugin, a real browser.

Real components: PostgreSQL, api-server, scheduler, dag-processor, triggerer
(LocalExecutor), the cluster emulator, and Debian's chromium driven over the DevTools
protocol (``tests/browser.py``). Authentication is Airflow's own (SimpleAuthManager with
passwords; a subclass in ``tests/ui_support`` hides one DAG from one user, because the
view must follow whatever the configured auth manager says).

One module-wide run of ``kn_ui_sweep`` (``tests/ui_dags/kn_ui.py``) is looked at while
it has a running, a finished and a failed kinetic task; the browser test releases the
running one last and watches the page change without a reload. ``kn_ui_gke`` waits for
a node on the emulator (its scheduling is delayed until the test lets it go).
Screenshots go to ``$KINETIC_TEST_ARTIFACTS`` (default ``test-artifacts/``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from browser import Browser
from components.airflow_services import AirflowServices, poll, session_members
from components.dag_runs import parsed, run_path, trigger
from components.stack import ComponentStack

HERE = Path(__file__).resolve().parent
DAG_FILE = HERE / "ui_dags" / "kn_ui.py"
COSTS_DAG_FILE = HERE / "ui_support" / "kn_ui_costs.py"  # a job that runs until it is stopped
PASSWORDS = {"admin": "admin-pass", "outsider": "outsider-pass"}
ARTIFACTS = Path(os.environ.get("KINETIC_TEST_ARTIFACTS") or HERE.parent / "test-artifacts")

pytestmark = pytest.mark.timeout(900)


class StatsdSink:
    """A UDP socket that keeps every StatsD line Airflow's processes send it."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except OSError:
                continue
            self.lines.extend(data.decode(errors="replace").splitlines())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


class UiStack(ComponentStack):
    """Airflow with passwords (no all-admins), the emulator, job storage on local disk."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        shutil.copy(DAG_FILE, self.dags / DAG_FILE.name)
        shutil.copy(COSTS_DAG_FILE, self.dags / COSTS_DAG_FILE.name)
        self.release = root / "release-slow"
        self.statsd = StatsdSink()
        self.tokens: dict[str, str] = {}

    def start(self) -> None:
        self.pg.start()
        self.emulator.start()
        passwords = self.root / "passwords.json"
        passwords.write_text(json.dumps(PASSWORDS))
        env = {
            **self.emulator.airflow_env(),
            "KINETIC_BACKEND": "local",
            "KINETIC_BASE_URI": f"file://{self.kinetic_root}",
            "KINETIC_POLL_INTERVAL": "0.5",
            "KINETIC_METRICS_INTERVAL": "0.5",
            "KN_UI_RELEASE": str(self.release),
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(HERE / "ui_support"), os.environ.get("PYTHONPATH")])
            ),
            "AIRFLOW__CORE__AUTH_MANAGER": "kn_ui_auth.PerDagAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,outsider:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(self.statsd.port),
        }
        self.airflow = TokenServices(
            self,
            self.root / "airflow",
            self.dags,
            extra_env=env,
            parallelism=8,
            database_url=self.pg.create_database("airflow"),
        )
        self.airflow.start()
        for dag_id in (
            "kn_ui_sweep",
            "kn_ui_keras",
            "kn_ui_gke",
            "kn_ui_secret",
            "kn_ui_fail",
            "kn_ui_costs",
        ):
            poll(
                lambda d=dag_id: parsed(self.api, d),
                timeout=120,
                what=f"DAG {dag_id} to be parsed",
                diagnostics=self.airflow.diagnostics,
            )

    def token(self, user: str) -> str:
        if user not in self.tokens:
            assert self.airflow is not None
            body = json.dumps({"username": user, "password": PASSWORDS[user]}).encode()
            request = urllib.request.Request(
                self.airflow.base_url + "/auth/token",
                data=body,
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                self.tokens[user] = json.loads(response.read())["access_token"]
        return self.tokens[user]

    def get(self, path: str, user: str | None = "admin") -> tuple[int, Any]:
        """(status, JSON body) of a GET as ``user`` (None: no credentials at all)."""
        assert self.airflow is not None
        headers = {"Accept": "application/json"}
        if user is not None:
            headers["Authorization"] = f"Bearer {self.token(user)}"
        request = urllib.request.Request(self.airflow.base_url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                return exc.code, json.loads(text)
            except ValueError:
                return exc.code, text

    def stop(self) -> None:
        super().stop()
        self.statsd.close()


class TokenServices(AirflowServices):
    """The services' REST helper, as the admin user (this deployment has no all-admins mode)."""

    def __init__(self, stack: UiStack, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stack = stack

    def auth_headers(self, path: str) -> dict[str, str]:
        if path == "/api/v2/monitor/health":  # public, and asked before any user can log in
            return {}
        return {"Authorization": f"Bearer {self.stack.token('admin')}"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    stack = UiStack(tmp_path_factory.mktemp("ui"))
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


def _jobs(stack: UiStack, query: str, user: str = "admin") -> dict[str, Any]:
    status, body = stack.get(f"/kinetic/api/jobs?{query}", user)
    assert status == 200, body
    return body


def _by_task(body: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(row["task_id"], row["map_index"]): row for row in body["jobs"]}


@pytest.fixture(scope="module")
def sweep(stack: UiStack) -> dict[str, Any]:
    """A run of kn_ui_sweep with a running, two finished and a failed kinetic task, plus the
    gke run waiting for a node; returns the run ids and the view's answer at that moment."""
    stack.emulator.admin.delay_scheduling(600)  # let go by the browser test
    gke_run = trigger(stack.api, "kn_ui_gke")
    run_id = trigger(stack.api, "kn_ui_sweep")
    secret_run = trigger(stack.api, "kn_ui_secret")
    fail_run = trigger(stack.api, "kn_ui_fail")  # runs alongside; test_a_failure_... follows it

    def mid_state() -> dict[str, Any] | None:
        rows = _by_task(_jobs(stack, f"dag_id=kn_ui_sweep&run_id={urllib.parse.quote(run_id)}"))
        states = {key: row["state"] for key, row in rows.items()}
        wanted = {
            ("train", 0): "succeeded",
            ("train", 1): "succeeded",
            ("broken", -1): "failed",
            ("diverges_badly", -1): "failed",
            ("packs_a_lock", -1): "failed",
            ("slow", -1): "running",
        }
        ended = [k for k in wanted if k[0] != "slow"]
        ti_done = all(rows.get(k, {}).get("ti_state") in ("success", "failed") for k in ended)
        return {"rows": rows, "states": states} if states == wanted and ti_done else None

    snapshot = poll(mid_state, timeout=240, what="the sweep's mid state", diagnostics=stack.api.diagnostics)
    poll(
        lambda: (
            _jobs(stack, "dag_id=kn_ui_secret")["jobs"][:1]
            and _jobs(stack, "dag_id=kn_ui_secret")["jobs"][0]["ti_state"] == "success"
        ),
        timeout=180,
        what="kn_ui_secret to finish",
        diagnostics=stack.api.diagnostics,
    )
    return {"run_id": run_id, "gke_run": gke_run, "secret_run": secret_run, "fail_run": fail_run, **snapshot}


def test_the_view_lists_running_finished_and_failed_jobs_of_a_run(sweep: dict[str, Any]) -> None:
    rows = sweep["rows"]
    assert set(rows) == {
        ("train", 0),
        ("train", 1),
        ("broken", -1),
        ("diverges_badly", -1),
        ("packs_a_lock", -1),
        ("slow", -1),
    }
    trained = rows[("train", 0)]
    assert trained["label"] == "lr=0.01" and rows[("train", 1)]["label"] == "lr=0.1"
    assert trained["accelerator"] == "tpu-v6e-2x4"  # tpu-v6e-8, in the canonical spelling
    assert trained["backend"] == "local"
    assert trained["result"]["ok"] is True and trained["result"]["value_type"] == "dict"
    assert "'loss'" in trained["result"]["value_repr"]
    # it ran on this machine's CPU: its wall time, and no accelerator bill
    assert trained["device"] == "local CPU" and trained["duration_seconds"] >= 1.0
    assert trained["chip_hours"] == 0 and trained["run_seconds"] == pytest.approx(trained["duration_seconds"])
    packaging = rows[("packs_a_lock", -1)]
    assert (packaging["state"], packaging["ending"]) == ("failed", "failed_while_packaging"), packaging
    assert packaging["doing"].startswith("failed while packaging: "), packaging
    failed = rows[("broken", -1)]
    assert failed["ti_state"] == "failed"
    assert failed["result"]["error_type"] == "ValueError"
    assert failed["result"]["error_message"] == "loss diverged at step 3"
    running = rows[("slow", -1)]
    assert running["doing"] == "running as a local process" and running["result"] is None
    assert running["ti_state"] in ("deferred", "running")
    assert running["output_dir"].startswith("file://")


def test_the_view_sums_chip_hours_per_run_and_filters_by_state(stack: UiStack, sweep: dict[str, Any]) -> None:
    run_id = urllib.parse.quote(sweep["run_id"])
    body = _jobs(stack, f"dag_id=kn_ui_sweep&state=succeeded&run_id={run_id}")
    assert {(r["task_id"], r["map_index"]) for r in body["jobs"]} == {("train", 0), ("train", 1)}
    (run,) = body["runs"]  # the cost table shows what the filter lets through, like the jobs table
    assert run["tasks"] == 2 and run["states"] == {"succeeded": 2}
    expected = sum(r["duration_seconds"] for r in body["jobs"])
    assert run["run_seconds"] == pytest.approx(expected, abs=1e-3) and run["run_seconds"] >= 2.0
    # wall time: from the first job's start to the last one's end, not the jobs' times added up
    span = max(r["ended_at"] for r in body["jobs"]) - min(r["first_started_at"] for r in body["jobs"])
    assert run["wall_seconds"] == pytest.approx(span, abs=1e-3)
    assert max(r["duration_seconds"] for r in body["jobs"]) <= run["wall_seconds"] + 1e-3
    assert run["chip_hours"] == 0  # local runs hold no accelerator
    body = _jobs(stack, f"dag_id=kn_ui_sweep&state=failed&run_id={run_id}")
    listed = {r["task_id"] for r in body["jobs"]}
    assert listed == {"broken", "diverges_badly", "packs_a_lock"}  # packaging failures are failures
    (run,) = body["runs"]
    assert run["tasks"] == 3 and run["states"] == {"failed": 3}
    status, body = stack.get("/kinetic/api/jobs?state=sleeping")
    assert status == 400 and "unknown state 'sleeping'" in body["detail"]


def test_the_view_refuses_strangers_and_hides_dags_a_user_may_not_see(
    stack: UiStack, sweep: dict[str, Any]
) -> None:
    for path in (
        "/kinetic/api/jobs",
        "/kinetic/jobs",
        f"/kinetic/api/task/kn_ui_sweep/{sweep['run_id']}/slow/-1",
    ):
        status, _ = stack.get(path, user=None)
        assert status == 401, path
    assert {"kn_ui_sweep", "kn_ui_secret"} <= set(_jobs(stack, "")["dag_ids"])
    seen = _jobs(stack, "", user="outsider")
    assert "kn_ui_secret" not in seen["dag_ids"] and "kn_ui_sweep" in seen["dag_ids"]
    assert all(r["dag_id"] != "kn_ui_secret" for r in seen["jobs"]) and seen["jobs"]
    assert not _jobs(stack, "dag_id=kn_ui_secret", user="outsider")["jobs"]
    status, _ = stack.get(f"/kinetic/api/task/kn_ui_secret/{sweep['secret_run']}/secret_sauce/-1", "outsider")
    assert status == 404
    status, body = stack.get(f"/kinetic/api/task/kn_ui_secret/{sweep['secret_run']}/secret_sauce/-1")
    assert status == 200 and body["state"] == "succeeded"


def test_mapped_sweep_instances_read_like_their_arguments(stack: UiStack, sweep: dict[str, Any]) -> None:
    listed = stack.api.api(
        "GET", f"{run_path('kn_ui_sweep', sweep['run_id'])}/taskInstances/train/listMapped"
    )
    labels = {ti["map_index"]: ti["rendered_map_index"] for ti in listed["task_instances"]}
    assert labels == {0: "lr=0.01", 1: "lr=0.1"}  # epochs=2 came from .partial(): the same for all


def _links(stack: UiStack, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
    path = f"{run_path(dag_id, run_id)}/taskInstances/{task_id}/links"
    if map_index >= 0:
        path += f"?map_index={map_index}"
    return stack.api.api("GET", path)["extra_links"]


def test_extra_links_are_right_on_every_backend(stack: UiStack, sweep: dict[str, Any]) -> None:
    run = urllib.parse.quote(sweep["run_id"], safe="")
    # Airflow stores a task's links when its worker is done with it (here: when it defers).
    local = poll(
        lambda: (links := _links(stack, "kn_ui_sweep", sweep["run_id"], "slow"))["Kinetic job"] and links,
        timeout=120,
        what="the deferred local task's links",
    )
    assert local == {"Kinetic job": f"/dags/kn_ui_sweep/runs/{run}/tasks/slow/plugin/kinetic-job"}
    mapped = _links(stack, "kn_ui_sweep", sweep["run_id"], "train", 1)
    assert mapped["Kinetic job"] == f"/dags/kn_ui_sweep/runs/{run}/tasks/train/mapped/1/plugin/kinetic-job"

    # a Kubernetes connection (the emulator) is no GKE cluster: no console or Cloud Logging link
    def deferred_links() -> dict[str, Any] | None:
        links = _links(stack, "kn_ui_gke", sweep["gke_run"], "after_scale_up")
        return links if links.get("Kinetic job") else None

    gke = poll(deferred_links, timeout=120, what="the deferred gke task's links")
    assert gke["Kinetic job"].endswith("/tasks/after_scale_up/plugin/kinetic-job")
    assert not gke.get("Kinetic Job (GKE console)") and not gke.get("Kinetic Job logs (Cloud Logging)")


# What a writer of job storage can do to the view ------------------------------------------------
_FORMATTERS_JS = """[when("yesterday"), when(1e20), when(null), dur("soon"), chipHours("many"),
  rowOr(() => { throw new Error("bad row"); }, {}, 3, () => "x")]"""


def test_a_progress_file_no_watcher_wrote_leaves_the_pages_drawn(stack: UiStack, sweep: dict) -> None:
    """A bucket writer puts times that are no numbers into a running job's progress.json: its row
    says "unreadable" and why, and the rest of the jobs page and the job's tab are drawn (the
    page's time formatting threw on them: "could not load: Invalid time value", nothing drawn)."""
    slow = sweep["rows"][("slow", -1)]
    progress = stack.kinetic_root / "jobs" / slow["job_id"] / "status" / "progress.json"
    original = progress.read_text()
    forged = {
        **json.loads(original),
        "time": "noon",
        "running_since": "yesterday",
        "history": [{"state": "running", "text": "forged", "time": "noon"}],
    }
    run = urllib.parse.quote(sweep["run_id"], safe="")
    base = stack.api.base_url
    try:
        progress.write_text(json.dumps(forged))  # the watcher rewrites it only on a change: none now

        def forged_seen() -> dict[str, Any] | None:  # the view shares its reads for a few seconds
            row = _by_task(_jobs(stack, f"dag_id=kn_ui_sweep&run_id={run}"))[("slow", -1)]
            return row if row["state"] != "running" else None

        row = poll(forged_seen, timeout=30, what="the view to read the forged progress.json")
        # its state in the one vocabulary (the jobs CLI's word) is unknown; its ending says why
        assert row["state"] == "unknown" and row["ending"] == "unreadable" and row["started_at"] is None, row
        assert "progress file cannot be read" in row["doing"] and "running_since" in row["doing"], row
        status, tab = stack.get(f"/kinetic/api/task/kn_ui_sweep/{run}/slow/-1")
        assert status == 200 and tab["state"] == "unknown" and tab["ending"] == "unreadable", tab
        assert tab["history"] == [], tab
        with Browser() as browser:
            browser.set_cookie("_token", stack.token("admin"), base)
            browser.goto(f"{base}/kinetic/jobs?dag_id=kn_ui_sweep")
            text = browser.wait_for_text("loss diverged at step 3", timeout=60)  # the other rows
            assert "unreadable" in text and "progress file cannot be read" in text, text
            assert "could not load" not in text and "updated " in text, text
            assert browser.evaluate(_FORMATTERS_JS)[:5] == ["", "", "", "", ""]
            assert "bad row" in browser.evaluate(_FORMATTERS_JS)[5]
            _shot(browser, "kinetic-jobs-page-unreadable-row.png")
            browser.goto(f"{base}/kinetic/task/kn_ui_sweep/{run}/slow/-1")
            browser.wait_for_text("progress file cannot be read", timeout=60)
            text = browser.wait_for_text("updated ", timeout=60)  # the whole tab drawn, metrics too
            assert "Attempts" in text and slow["job_id"] in text, text
            assert "could not load" not in text and "progress file cannot be read" in text, text
            _shot(browser, "kinetic-task-tab-unreadable.png")
    finally:
        progress.write_text(original)


def _rss_mb(stack: UiStack) -> float:
    """Resident memory of the api-server (every process of its session), in MB."""
    assert stack.airflow is not None
    total_kb = 0
    for pid in session_members(stack.airflow.procs["api-server"].pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
    return total_kb / 1024


def test_forged_metrics_chunks_do_not_exhaust_the_api_server(stack: UiStack, sweep: dict[str, Any]) -> None:
    """20 chunks of 8 MiB, each 1.4 M points, beside a job's one real chunk, read by an ordinary
    viewer twice (the tab re-reads them every few seconds): the real curve is shown, and the
    api-server's memory grows by less than 100 MB (before, about 123 MB a chunk, kept)."""
    train = sweep["rows"][("train", 0)]
    metrics = stack.kinetic_root / "jobs" / train["job_id"] / "metrics"
    path = f"/kinetic/api/metrics/kn_ui_sweep/{urllib.parse.quote(sweep['run_id'], safe='')}/train/0"
    status, body = stack.get(path, "outsider")  # the route and what it imports, before measuring
    assert status == 200 and body["metrics"] == [], body
    before = _rss_mb(stack)
    metrics.mkdir(exist_ok=True)
    real = {"points": {"loss": [[1, 0.5], [2, 0.25]]}}
    real["summary"] = {"loss": {"last": 0.25, "last_step": 2, "min": 0.25, "max": 0.5, "count": 2}}
    (metrics / "h0-900000.json").write_text(json.dumps(real))
    count = (8 * 1024 * 1024 - 32) // len(b"[1,0],")
    forged = b'{"points":{"loss":[' + b"[1,0]," * count + b"[1,0]]}}"
    assert len(forged) <= 8 * 1024 * 1024
    planted = [metrics / f"h0-9{seq:05d}.json" for seq in range(1, 21)]
    try:
        for chunk in planted:
            chunk.write_bytes(forged)
        for _ in range(2):
            status, body = stack.get(path, "outsider")
            assert status == 200, body
        (attempt,) = body["attempts"]
        assert body["metrics"] == ["loss"] and attempt["points"]["loss"] == [[1, 0.5], [2, 0.25]], body
        after = _rss_mb(stack)
        print(f"api-server RSS: {before:.0f} MB before, {after:.0f} MB after 20 forged chunks")
        assert after - before < 100, (before, after)
    finally:
        for chunk in [*planted, metrics / "h0-900000.json"]:
            chunk.unlink(missing_ok=True)


def test_a_job_stopped_by_mark_failed_shows_what_it_ran(stack: UiStack) -> None:
    """A user marks a deferred task failed: the listener (or the trigger) stops its job and no
    worker counts what it ran, yet it ran. The view shows its run time and chip-hours (none on
    the local backend), from its start to the stop, and counts it in its DAG run's wall time and
    job time."""
    run_id = trigger(stack.api, "kn_ui_costs")
    query = f"dag_id=kn_ui_costs&run_id={urllib.parse.quote(run_id, safe='')}"

    def running() -> dict[str, Any] | None:
        rows = _jobs(stack, query)["jobs"]
        ready = rows and rows[0]["state"] == "running" and rows[0]["ti_state"] == "deferred"
        return rows[0] if ready else None

    poll(running, timeout=180, what="kn_ui_costs's job to run, deferred", diagnostics=stack.api.diagnostics)
    stack.api.api("PATCH", f"{run_path('kn_ui_costs', run_id)}/taskInstances/held", {"new_state": "failed"})

    def stopped() -> dict[str, Any] | None:
        body = _jobs(stack, query)
        return body if body["jobs"] and body["jobs"][0]["ending"] == "cancelled" else None

    body = poll(stopped, timeout=120, what="the trigger to stop the job", diagnostics=stack.api.diagnostics)
    (row,) = body["jobs"]
    assert row["doing"].startswith("cancelled by "), row  # the listener or the trigger, first to act
    assert row["duration_seconds"] > 0 and row["chip_hours"] == 0, row  # it ran; local: no chips
    status, tab = stack.get(f"/kinetic/api/task/kn_ui_costs/{urllib.parse.quote(run_id, safe='')}/held/-1")
    assert status == 200, tab
    (job,) = tab["jobs"]
    assert job["finished_at"] - job["started_at"] == pytest.approx(job["duration_seconds"], abs=1e-3), job
    (run,) = body["runs"]
    assert run["run_seconds"] == pytest.approx(row["duration_seconds"], abs=1e-3)
    assert run["wall_seconds"] == pytest.approx(row["ended_at"] - row["first_started_at"], abs=1e-3)


_AXIS_JS = """(async () => {
  const holder = document.createElement("div");
  document.body.appendChild(holder);
  const data = [[1, 2, 3], [7998000, 7999000, 8000000]];
  const entry = chart(holder, "axis-check", "big values", ["bytes"], data);
  await new Promise((r) => setTimeout(r, 200));
  const axis = entry.plot.axes[1];
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = axis.font[0];
  const room = axis._size - axis.ticks.size - axis.gap;
  const labels = axis._values || [];
  const cut = labels.filter((l) => ctx.measureText(l).width / devicePixelRatio > room + 0.5);
  entry.plot.destroy();
  holder.remove();
  return {labels, cut};
})()"""


def test_a_charts_value_axis_shows_large_numbers_whole(stack: UiStack, sweep: dict[str, Any]) -> None:
    """Values near 8 million: uPlot's default labels (7,998,000) did not fit its 50-pixel axis and
    read "0,000"; the axis now labels them 7.998M... and is as wide as its longest label."""
    run = urllib.parse.quote(sweep["run_id"], safe="")
    base = stack.api.base_url
    with Browser() as browser:
        browser.set_cookie("_token", stack.token("admin"), base)
        browser.goto(f"{base}/kinetic/task/kn_ui_sweep/{run}/train/0")
        browser.wait_for_text("Attempts", timeout=60)
        found = poll(
            lambda: browser.evaluate("typeof chart === 'function'") and browser.evaluate(_AXIS_JS),
            timeout=30,
            what="a chart drawn on the tab",
        )
    assert found["cut"] == [] and found["labels"], found
    assert all(label.endswith("M") for label in found["labels"] if label != "0"), found
    assert len(set(found["labels"])) == len(found["labels"]), found  # neighbouring ticks differ


def test_accelerator_hours_reach_xcom_and_airflow_metrics(stack: UiStack, sweep: dict[str, Any]) -> None:
    path = f"{run_path('kn_ui_sweep', sweep['run_id'])}/taskInstances/train/xcomEntries/kinetic_usage"
    entry = stack.api.api("GET", f"{path}?map_index=0&deserialize=true")
    usage = entry["value"]
    usage = json.loads(usage) if isinstance(usage, str) else usage
    (attempt,) = usage["attempts"]
    assert attempt["accelerator"] == "tpu-v6e-2x4" and attempt["device"] == "local CPU"
    assert attempt["chips"] == 0 and attempt["spot"] is False  # the local backend ran it on the CPU
    assert attempt["outcome"] == "success" and attempt["queue_seconds"] is not None
    assert usage["chip_hours"] == 0 and attempt["run_seconds"] >= 1.0  # no bill; the wall time stays
    assert sweep["rows"][("train", 0)]["chip_hours"] == 0

    def counted() -> list[str] | None:
        lines = [line for line in stack.statsd.lines if ".kinetic." in f".{line}"]
        return lines if any("kinetic.chip_seconds:" in line for line in lines) else None

    lines = poll(counted, timeout=60, what="kinetic metrics over StatsD")
    chip_seconds = [line for line in lines if "kinetic.chip_seconds:" in line]
    assert any(line.endswith("|c") for line in chip_seconds), chip_seconds
    assert any("kinetic.run_time:" in line and line.endswith("|ms") for line in lines), lines
    assert any("kinetic.queue_wait:" in line for line in lines), lines


def _shot(browser: Browser, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return browser.screenshot(ARTIFACTS / name)


def _task_log(stack: UiStack, dag_id: str, task_id: str) -> str:
    files = [p for p in stack.api.task_log_files(dag_id) if f"task_id={task_id}" in str(p)]
    return "\n".join(p.read_text(errors="replace") for p in files)


def test_a_person_follows_the_sweep_in_the_browser(stack: UiStack, sweep: dict[str, Any]) -> None:
    base = stack.api.base_url
    run = urllib.parse.quote(sweep["run_id"], safe="")
    gke_run = urllib.parse.quote(sweep["gke_run"], safe="")
    with Browser() as browser:
        browser.set_cookie("_token", stack.token("admin"), base)
        # the navigation page, inside Airflow's UI
        browser.goto(f"{base}/plugin/kinetic-jobs")
        text = browser.wait_for_text("loss diverged at step 3", timeout=60)
        for needle in (
            "Kinetic jobs",
            "Cost per DAG run",
            "lr=0.01",
            "lr=0.1",
            "local CPU for tpu-v6e-2x4",
            "running as a local process",
            "failed while packaging: ",
        ):
            assert needle in text, (needle, text)
        browser.wait_for_text("waiting for a node matching", timeout=60)  # the gke job, scaling up
        _shot(browser, "kinetic-jobs-page.png")

        # a long exception name is cut with a tooltip: every row's links stay on screen
        browser.goto(f"{base}/kinetic/jobs")
        browser.wait_for_text("TrainingDivergedBecauseTheLearningRateWasFarTooHigh", timeout=60)
        layout = browser.evaluate(
            """(() => ({
              width: window.innerWidth,
              scroll: document.documentElement.scrollWidth,
              links: [...document.querySelectorAll("td.links")].map((td) => td.getBoundingClientRect().right),
              tips: [...document.querySelectorAll("[title]")].map((e) => e.title),
            }))()"""
        )
        assert layout["links"] and max(layout["links"]) <= layout["width"], layout
        assert layout["scroll"] <= layout["width"], layout
        assert any("TrainingDivergedBecauseTheLearningRateWasFarTooHighForThisModelAndDataset: lr=10" in t
                   for t in layout["tips"]), layout  # fmt: skip

        # the task-instance tab of the job that waits for a node
        browser.goto(f"{base}/dags/kn_ui_gke/runs/{gke_run}/tasks/after_scale_up/plugin/kinetic-job")
        text = browser.wait_for_text("waiting for a node matching", timeout=60)
        assert "waiting for node" in text and "(scale-up)" in text, text
        assert '{"cloud.google.com/gke-accelerator": "nvidia-l4"}' in text, text  # its nodeSelector
        _shot(browser, "kinetic-task-tab-waiting-for-node.png")
        stack.emulator.admin.delay_scheduling(0)  # the node pool has scaled up
        text = browser.wait_for_text("returned str", timeout=120)  # live: no reload
        assert "running on node gke-" in text, text
        browser.wait_for_text("gpu-l4 on gke", timeout=30)
        _shot(browser, "kinetic-task-tab-after-scale-up.png")

        # the running local job's tab, then its end, live
        browser.goto(f"{base}/dags/kn_ui_sweep/runs/{run}/tasks/slow/plugin/kinetic-job")
        text = browser.wait_for_text("running as a local process", timeout=60)
        assert "Attempts" in text and "local CPU" in text, text
        _shot(browser, "kinetic-task-tab-running.png")
        stack.release.write_text("go")
        browser.wait_for_text("returned str", timeout=120)
        _shot(browser, "kinetic-task-tab-finished.png")

    log = _task_log(stack, "kn_ui_gke", "after_scale_up")
    waiting = [line for line in log.splitlines() if "[kinetic] waiting for a node matching" in line]
    assert len(waiting) == 1, log  # one line per change, not one per look
    assert "[kinetic] running on node" in log and "[kinetic] finished: succeeded" in log, log


# A failure, as its user reads it -------------------------------------------------------------
_SCROLL_TEXT_JS = """(async () => {
  // Airflow's log viewer renders only the rows in view: scroll every scrolling box through
  // its whole height and keep each line of text seen, in order.
  const seen = [], known = new Set();
  const take = () => { for (const line of document.body.innerText.split("\\n"))
    if (!known.has(line)) { known.add(line); seen.push(line); } };
  take();
  const boxes = [...document.querySelectorAll("*")].filter((e) =>
    e.scrollHeight > e.clientHeight + 10 && /auto|scroll/.test(getComputedStyle(e).overflowY));
  for (const box of boxes) {
    for (let y = 0; y <= box.scrollHeight; y += Math.max(40, box.clientHeight / 3)) {
      box.scrollTop = y;
      await new Promise((r) => setTimeout(r, 120));
      take();
    }
  }
  return seen.join("\\n");
})()"""


def _records(path: Path) -> list[dict[str, Any]]:
    """A task log file's records (JSON lines; anything else as a plain event)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        out.append(record if isinstance(record, dict) else {"event": line})
    return out


def _try_logs(stack: UiStack, dag_id: str, task_id: str) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Per try: the worker's records and the triggerer's (the UI merges them into one log)."""
    tries: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for path in stack.api.task_log_files(dag_id):
        found = re.match(r"attempt=(\d+)\.log(\.trigger\.\d+\.log)?$", path.name)
        if f"task_id={task_id}" in str(path) and found:
            part = "trigger" if found.group(2) else "worker"
            tries.setdefault(int(found.group(1)), {}).setdefault(part, []).extend(_records(path))
    return tries


def _text(records: list[dict[str, Any]]) -> str:
    return "\n".join(str(r.get("event", "")) for r in records)


def test_a_failure_shows_the_users_traceback_and_names(stack: UiStack, sweep: dict[str, Any]) -> None:
    run_id = sweep["fail_run"]
    ti_path = f"{run_path('kn_ui_fail', run_id)}/taskInstances/diverges"
    poll(
        lambda: stack.api.api("GET", ti_path)["state"] == "failed",
        timeout=300,
        what="kn_ui_fail's two tries to fail",
        diagnostics=lambda: stack.api.diagnostics("kn_ui_fail"),
    )
    assert stack.api.api("GET", ti_path)["try_number"] == 2
    dag_file = stack.dags / DAG_FILE.name
    line = next(i for i, t in enumerate(dag_file.read_text().splitlines(), 1) if "KN-UI-RAISE" in t)
    frame = f'File "{dag_file}", line {line}, in check_loss'  # the user's file and line
    source = 'raise TrainingDiverged(f"loss {loss:g} at step 7")'

    # Each try's log: the traceback once, before Airflow's exception line; a small event.
    tries = _try_logs(stack, "kn_ui_fail", "diverges")
    assert set(tries) == {1, 2}, sorted(tries)
    for number, parts in tries.items():
        worker, triggered = parts["worker"], parts.get("trigger", [])
        every = worker + triggered
        text = _text(every)
        assert text.count(frame) == 1 and text.count(source) == 1, (number, text)
        assert json.dumps(every).count(f"line {line}, in check_loss") == 1, number  # in no other field
        assert "unusual_prefix_" not in json.dumps(every), number
        assert "kn_ui.TrainingDiverged: loss 1e+09 at step 7" in text, text
        failed_at = next(i for i, r in enumerate(worker) if r.get("event") == "Task failed with exception")
        shown_at = next(i for i, r in enumerate(worker) if frame in str(r.get("event")))
        assert shown_at < failed_at and worker[shown_at].get("level") == "error", worker[shown_at]
        # the traceback's lines are the last thing above Airflow's error line
        between = worker[shown_at:failed_at]
        assert all(r.get("level") == "error" for r in between), between
        assert between[-1]["event"] == "kn_ui.TrainingDiverged: loss 1e+09 at step 7", between
        assert all(frame not in json.dumps(r) for r in worker[failed_at:]), "the error repeats it"
        assert text.count("diverges: training") == 1, text  # streamed once, not again at the end
        (fired,) = [r for r in triggered if r.get("event") == "Trigger fired event"]
        event = json.dumps(fired)
        for absent in ("Traceback", "check_loss", "log_tail", "diverges: training", "traceback"):
            assert absent not in event, (absent, event)
        assert len(event) < 3000, event
        assert "traceback left out here: it is logged at the end of the task, before its error" in text

    # The view's data, the CLI and reproduce: the user's names and frames
    status, body = stack.get(f"/kinetic/api/task/kn_ui_fail/{urllib.parse.quote(run_id)}/diverges/-1")
    assert status == 200, body
    assert body["result"]["error_type"] == "kn_ui.TrainingDiverged", body["result"]
    assert frame in body["result"]["traceback"] and "unusual_prefix_" not in json.dumps(body)
    listed = _jobs(stack, "dag_id=kn_ui_fail")["jobs"]
    assert "unusual_prefix_" not in json.dumps(listed) and len(listed) == 2, listed
    assert all("traceback" not in row["result"] for row in listed), listed  # the tab's, not the list's
    cli = [sys.executable, "-m", "kinetic_airflow.cli"]
    where = ["--base-uri", f"file://{stack.kinetic_root}"]
    shown = subprocess.run(
        [*cli, "jobs", "result", body["job_id"], *where], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 1, shown.stderr
    assert "error_type: kn_ui.TrainingDiverged" in shown.stdout and frame in shown.stdout, shown.stdout
    redo = subprocess.run(  # this Airflow's environment: the job's key is in its metadata DB
        [*cli, "reproduce", body["job_id"], *where, "--workdir", str(stack.root / "redo")],
        capture_output=True,
        text=True,
        timeout=300,
        env=stack.airflow.env,
    )
    assert "the job failed: kn_ui.TrainingDiverged" in redo.stdout, redo.stdout + redo.stderr
    assert "reproduced: kn_ui.TrainingDiverged: loss 1e+09 at step 7" in redo.stdout, redo.stdout
    for out in (shown.stdout + shown.stderr, redo.stdout + redo.stderr):
        assert "unusual_prefix_" not in out, out

    # On screen: Airflow's log page, the Kinetic tab and the jobs page
    base = stack.api.base_url
    run = urllib.parse.quote(run_id, safe="")
    with Browser() as browser:
        browser.set_cookie("_token", stack.token("admin"), base)
        browser.goto(f"{base}/dags/kn_ui_fail/runs/{run}/tasks/diverges?try_number=2")
        browser.wait_for_text("Task failed with exception", timeout=90)
        page = str(browser.evaluate(_SCROLL_TEXT_JS, timeout=120))
        _shot(browser, "airflow-log-of-a-failure.png")
        assert frame in page and source in page, page
        assert page.index(frame) < page.index("Task failed with exception"), page
        assert "kn_ui.TrainingDiverged: loss 1e+09 at step 7" in page and "unusual_prefix_" not in page

        browser.goto(f"{base}/dags/kn_ui_fail/runs/{run}/tasks/diverges/plugin/kinetic-job")
        tab = browser.wait_for_text(frame, timeout=60)
        assert source in tab and "kn_ui.TrainingDiverged: loss 1e+09 at step 7" in tab, tab
        assert "kinetic_airflow/job/runner.py" not in tab and "unusual_prefix_" not in tab, tab
        _shot(browser, "kinetic-task-tab-traceback.png")

        browser.goto(f"{base}/plugin/kinetic-jobs")
        jobs = browser.wait_for_text("kn_ui.TrainingDiverged", timeout=60)
        assert "unusual_prefix_" not in jobs, jobs

        # A module the job does not have: the import's file and line, and the fix
        line = next(i for i, t in enumerate(dag_file.read_text().splitlines(), 1) if "KN-UI-IMPORT" in t)
        frame = f'File "{dag_file}", line {line}, in needs_missing'
        browser.goto(f"{base}/dags/kn_ui_fail/runs/{run}/tasks/needs_missing?try_number=1")
        browser.wait_for_text("Task failed with exception", timeout=90)
        page = str(browser.evaluate(_SCROLL_TEXT_JS, timeout=120))
        assert frame in page and page.index(frame) < page.index("Task failed with exception"), page
        assert "ModuleNotFoundError: No module named 'kn_ui_not_installed'" in page, page
        assert "requirements=['kn_ui_not_installed']" in page and "unusual_prefix_" not in page, page
        browser.goto(f"{base}/dags/kn_ui_fail/runs/{run}/tasks/needs_missing/plugin/kinetic-job")
        tab = browser.wait_for_text(frame, timeout=60)
        assert "module 'kn_ui_not_installed' is not installed in the local job" in tab, tab


# Metrics a sweep reported (kinetic_airflow.keras.MetricsCallback) ----------------------------------
_CHART_POINTS_JS = """(() => {
  const el = document.querySelector('#charts .kn-chart[data-metric="loss"]');
  const state = document.querySelector("#summary .state");
  return el ? {points: Number(el.dataset.points), state: state ? state.textContent : ""} : null;
})()"""


_SWEEP_PAGE_JS = """(() => {
  const points = (id) => Number((document.querySelector(`#${id} .kn-chart`) || {dataset: {}}).dataset.points);
  const rows = [...document.querySelectorAll("#members tr.member")].map((tr) => tr.dataset.mapIndex);
  return {rows, scatter: points("scatter"), overlay: points("overlay")};
})()"""


def _chart(browser: Browser, wanted: Any, what: str, timeout: float = 180) -> dict[str, Any]:
    return poll(
        lambda: (found := browser.evaluate(_CHART_POINTS_JS)) and wanted(found) and found,
        timeout=timeout,
        what=what,
    )


def test_a_keras_sweep_shows_live_curves_and_compares_its_members(stack: UiStack) -> None:
    """Four members train a tiny Keras model with kinetic's callback: the tab's loss chart gains
    points while its job runs; afterwards the sweep page ranks the four by final loss and plots
    final loss against lr."""
    base = stack.api.base_url
    run_id = trigger(stack.api, "kn_ui_keras")
    run = urllib.parse.quote(run_id, safe="")
    with Browser() as browser:
        browser.set_cookie("_token", stack.token("admin"), base)
        browser.goto(f"{base}/kinetic/task/kn_ui_keras/{run}/fit/0")
        first = _chart(browser, lambda f: f["points"] == 3, "3 epochs of loss on the chart", timeout=300)
        assert first["state"] == "running", first
        stack.release.with_name(stack.release.name + ".keras3").write_text("go")
        more = _chart(browser, lambda f: f["points"] == 6, "6 epochs of loss on the chart")
        assert more["state"] == "running", more  # it grew while the job ran: no reload
        _shot(browser, "kinetic-task-tab-live-curves.png")
        stack.release.with_name(stack.release.name + ".keras6").write_text("go")
        done = _chart(browser, lambda f: f["points"] == 10 and f["state"] == "succeeded", "the end")
        assert done["points"] == 10

        def all_ended() -> bool:
            status, body = stack.get(f"/kinetic/api/sweep/kn_ui_keras/fit?run_id={run}")
            members = body["runs"][0]["members"] if status == 200 and body["runs"] else []
            return len(members) == 4 and all(m["ti_state"] == "success" for m in members)

        poll(all_ended, timeout=300, what="the four members to succeed", diagnostics=stack.api.diagnostics)
        status, body = stack.get(f"/kinetic/api/sweep/kn_ui_keras/fit?run_id={run}")
        assert status == 200, body
        members = body["runs"][0]["members"]
        assert sorted(m["label"] for m in members) == ["lr=0.001", "lr=0.003", "lr=0.01", "lr=0.03"]
        by_loss = sorted(members, key=lambda m: m["final"]["loss"])
        assert all(len(m["curves"]["loss"]) == 10 for m in members)
        assert stack.get(f"/kinetic/api/sweep/kn_ui_keras/fit?run_id={run}", None)[0] == 401
        assert stack.get(f"/kinetic/api/metrics/kn_ui_keras/{run}/fit/0", None)[0] == 401
        # what the auth manager lets a user read: the outsider sees this sweep, never kn_ui_secret
        assert stack.get(f"/kinetic/api/sweep/kn_ui_keras/fit?run_id={run}", "outsider")[0] == 200
        assert stack.get(f"/kinetic/api/metrics/kn_ui_keras/{run}/fit/0", "outsider")[0] == 200
        assert stack.get("/kinetic/api/sweep/kn_ui_secret/secret_sauce", "outsider")[0] == 404

        browser.goto(f"{base}/kinetic/sweep/kn_ui_keras/fit?run_id={run}")
        page = poll(
            lambda: (
                (found := browser.evaluate(_SWEEP_PAGE_JS))
                and len(found["rows"]) == 4
                and found["scatter"] == 4
                and found
            ),
            timeout=60,
            what="the sweep page's table and scatter",
        )
        assert page["rows"] == [str(m["map_index"]) for m in by_loss], (page, by_loss)  # by final loss
        assert page["overlay"] == 40  # four curves of ten epochs
        _shot(browser, "kinetic-sweep-page.png")
        # the task tab inside Airflow's UI links to it
        browser.goto(f"{base}/dags/kn_ui_keras/runs/{run}/tasks/fit/mapped/0/plugin/kinetic-job")
        browser.wait_for_text("compare the sweep", timeout=60)
    status, jobs = stack.get(f"/kinetic/api/jobs?dag_id=kn_ui_keras&run_id={run}")
    assert status == 200 and len(jobs["jobs"]) == 4
    gauges = poll(
        lambda: [line for line in stack.statsd.lines if "kinetic.metric.loss" in line and "|g" in line],
        timeout=60,
        what="the final loss as a StatsD gauge",
    )
    assert len(gauges) >= 4, gauges
