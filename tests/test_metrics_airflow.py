"""What a job reported reaches Airflow (dag.test(), local backend): XCom ``kinetic_metrics`` for a
downstream pick_best, and the extra of the outlet Asset events, read by a DAG scheduled on the
Asset."""

from __future__ import annotations

import json

import pytest
from helpers import ti_states, xcom


@pytest.mark.parametrize("base_uri", ["file"], indirect=True)
def test_final_metrics_in_xcom_and_asset_events(base_uri, tmp_path, monkeypatch):
    import kn_metrics

    dr = kn_metrics.kn_metrics_sweep().test()
    assert dr.state == "success", ti_states(dr)
    finals = [xcom(dr, "train", map_index=i, key="kinetic_metrics") for i in range(3)]
    for lr, final in zip([0.01, 0.1, 0.05], finals, strict=True):
        assert final["loss"] == pytest.approx((1 - lr) ** 50)
        assert final["accuracy"] == pytest.approx(1 - (1 - lr) ** 50)
    assert xcom(dr, "pick_best") == {
        "best_index": 1,
        "losses": [f["loss"] for f in finals],
        "trained": 3,
    }

    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.uri == kn_metrics.MODEL.uri, AssetEvent.source_run_id == dr.run_id)
            .order_by(AssetEvent.source_map_index)
        ).all()
        extras = {e.source_map_index: e.extra for e in events}
    assert sorted(extras) == [0, 1, 2]
    for i, final in enumerate(finals):
        assert extras[i]["kinetic_metrics"] == final
        assert extras[i]["kinetic_best"]["loss"] == final["loss"]  # loss only went down
        assert extras[i]["kinetic_best"]["accuracy"] == final["accuracy"]

    out = tmp_path / "consumer.json"
    monkeypatch.setenv("KN_TEST_METRICS_OUT", str(out))
    consumer = kn_metrics.kn_metrics_consumer().test()
    assert consumer.state == "success", ti_states(consumer)
    seen = json.loads(out.read_text())
    assert seen["kinetic_metrics"] in finals

    # what the Kinetic view shows of it: the tab's curves and the sweep table
    from kinetic_airflow.ui.metrics_view import parse_label, sweep, task_metrics

    with create_session() as session:
        curves = task_metrics(session, dr.dag_id, dr.run_id, "train", 1)
        table = sweep(session, {dr.dag_id}, dr.dag_id, "train", dr.run_id)
    assert curves["metrics"] == ["accuracy", "loss"] and len(curves["attempts"]) == 1
    assert [p[0] for p in curves["attempts"][0]["points"]["loss"]] == list(range(1, 51))
    assert curves["final"] == finals[1]
    (run,) = table["runs"]
    assert table["params"] == ["lr"] and table["higher_is_better"] == {"accuracy": True, "loss": False}
    assert [(m["label"], m["params"], m["state"]) for m in run["members"]] == [
        ("lr=0.01", {"lr": 0.01}, "succeeded"),
        ("lr=0.1", {"lr": 0.1}, "succeeded"),
        ("lr=0.05", {"lr": 0.05}, "succeeded"),
    ]
    assert [m["final"] for m in run["members"]] == finals
    assert all(len(m["curves"]["loss"]) == 50 for m in run["members"])
    # a second run of the sweep: the table across runs groups the members by run, newest first
    again = kn_metrics.kn_metrics_sweep().test()
    assert again.state == "success", ti_states(again)
    with create_session() as session:
        both = sweep(session, {dr.dag_id}, dr.dag_id, "train", None)
    assert [r["run_id"] for r in both["runs"]][:2] == [again.run_id, dr.run_id]
    assert [len(r["members"]) for r in both["runs"][:2]] == [3, 3]
    assert parse_label("lr=1e-3, depth=4, opt=adam") == {"lr": 0.001, "depth": 4, "opt": "adam"}


def test_final_metrics_are_statsd_gauges(monkeypatch):
    """Through Airflow's own StatsD client (as a task process sets it up), to a real UDP socket."""
    import socket

    from airflow.sdk._shared.observability.metrics import stats
    from airflow.sdk.observability.metrics import stats_utils

    from kinetic_airflow.reported_metrics import _gauges

    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(5)
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(sink.getsockname()[1]))
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
    try:
        _gauges({"loss": 0.125, "val/acc": 0.75, "nan": None}, {"dag_id": "d", "task_id": "t"})
        lines = sorted(sink.recv(65536).decode().splitlines() + sink.recv(65536).decode().splitlines())
    finally:
        stats.initialize(factory=stats.NoStatsLogger, export_legacy_names=True)
        sink.close()
    assert [line.split(":", 1)[0].rsplit(".", 2)[-2:] for line in lines] == [
        ["metric", "loss"],
        ["metric", "val_acc"],
    ], lines
    assert lines[0].endswith(":0.125|g") and lines[1].endswith(":0.75|g"), lines


def test_gauge_tags_survive_tagged_line_formats(monkeypatch):
    """A metric or DAG name with a tag format's separators is cleaned in the tag values (the
    Datadog and InfluxDB line formats would cut the line), and a sweep member carries its
    map index so members are series of their own."""
    from kinetic_airflow import reported_metrics
    from kinetic_airflow.job.ref import JobRef

    seen: list[tuple[str, dict]] = []

    class Recorder:
        @staticmethod
        def gauge(stat, value, tags=None):
            seen.append((stat, tags))

    import airflow.sdk.observability.stats as stats_module

    monkeypatch.setattr(stats_module, "Stats", Recorder)
    reported_metrics._gauges({"val:acc|top,1 #x": 0.5}, {"dag_id": "d", "task_id": "t", "map_index": "3"})
    [(stat, tags)] = seen
    assert stat == "kinetic.metric.val_acc_top_1_x", stat
    assert tags == {"dag_id": "d", "task_id": "t", "map_index": "3", "metric": "val_acc_top_1_x"}, tags

    class TI:
        dag_id, task_id, map_index = "d", "t", 3

    job = JobRef("j", "gke", "gs://b/jobs/j", accelerator="tpu-v6e-8")
    assert reported_metrics.gauge_tags(TI(), job)["map_index"] == "3"
    TI.map_index = -1  # not mapped: no map_index tag at all
    assert "map_index" not in reported_metrics.gauge_tags(TI(), job)
