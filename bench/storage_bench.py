"""Payload upload + result download of a large numpy array: kinetic-airflow vs raw GCS calls.

Both sides talk to the same fake-gcs-server in one run. Each measured step runs
in a fresh subprocess so its peak RSS (ru_maxrss) belongs to that step alone.

    python bench/storage_bench.py [--mib 256] [--repeat 3]

Prints per-step seconds and MiB/s, the upload and the download throughput ratio
kinetic/raw, each on its own (target >= 0.9), and peak memory over the object size
(target <= 1.5; the array itself counts as 1). Both sides do the same work: pickle, digest
(sha256, which kinetic's runner verifies), upload; download, unpickle. kinetic's download
also verifies the envelope before unpickling it (sha256 of the downloaded bytes, digested
while it streams in, and the HMAC in result.json under the job key, kinetic_airflow.integrity),
which the raw side does not: that is the cost of verification.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


BENCH_KEY = "00" * 32  # a job's key (the worker reads it from the job record)


def _identity(x):
    return x


def step(mode: str, bucket: str, mib: int) -> dict:
    """One measured step, in its own process."""
    import cloudpickle
    import numpy as np
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    from kinetic_airflow.job.envelope import dump_envelope
    from kinetic_airflow.job.integrity import HashingFile, result_tag
    from kinetic_airflow.job.layout import JobLayout
    from kinetic_airflow.job.payload import write_payload
    from kinetic_airflow.job.storage import GCSStorage
    from kinetic_airflow.results import load_verified_envelope

    client = gcs.Client(project="bench", credentials=AnonymousCredentials())
    base_rss = _rss_bytes()
    size = mib * 1024 * 1024
    layout = JobLayout.for_job(f"gs://{bucket}/kinetic", "bench-job")
    raw_name = "raw/object.bin"
    if mode in ("kinetic-upload", "raw-upload"):
        arr = np.random.default_rng(0).random(size // 8)
    else:
        arr = None
    start = time.perf_counter()
    if mode == "kinetic-upload":
        write_payload(GCSStorage(client), layout.payload, _identity, [arr], {})
    elif mode == "kinetic-download":  # as the worker: read result.json, verify, then unpickle
        storage = GCSStorage(client)
        summary = json.loads(storage.read_text_or_none(layout.result_summary()))
        value = load_verified_envelope(storage, layout.result(), summary, BENCH_KEY, 0)[0]["value"]
        assert value.nbytes == size
    elif mode == "raw-upload":  # the same work: pickle the same payload, digest it, upload it
        data = cloudpickle.dumps({"fn": _identity, "args": [arr], "kwargs": {}, "env": {}, "volumes": None})
        hashlib.sha256(data).hexdigest()  # kinetic's manifest carries the digest the runner verifies
        client.bucket(bucket).blob(raw_name).upload_from_string(data)
    elif mode == "raw-download":  # the same work: download the same envelope in one call, unpickle it
        value = cloudpickle.loads(client.bucket(bucket).blob("raw/result.pkl").download_as_bytes())["value"]
        assert value.nbytes == size
    elif mode == "prepare":
        import tempfile

        arr = np.random.default_rng(1).random(size // 8)
        with tempfile.NamedTemporaryFile() as fh:
            sink = HashingFile(fh)  # as the runner writes it: digested while pickled
            dump_envelope({"ok": True, "value": arr}, sink)
            fh.flush()
            GCSStorage(client).upload_file(fh.name, layout.result())
        sha = sink.hexdigest()
        integrity = {"sha256": sha, "host": 0, "hmac": result_tag(BENCH_KEY, 0, sha)}
        GCSStorage(client).write_text(
            layout.result_summary(), json.dumps({"ok": True, "integrity": integrity})
        )
        client.bucket(bucket).blob("raw/result.pkl").upload_from_string(
            cloudpickle.dumps({"ok": True, "value": arr})
        )
        return {}
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_over_size": (_peak_bytes() - base_rss) / size}


def _run_step(mode: str, bucket: str, mib: int, env: dict) -> dict:
    out: Any = subprocess.run(
        [sys.executable, __file__, "--step", mode, "--bucket", bucket, "--mib", str(mib)],
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode != 0:
        raise SystemExit(f"step {mode} failed:\n{out.stderr[-3000:]}")
    out = out.stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--step", default=None)
    parser.add_argument("--bucket", default="bench")
    args = parser.parse_args()
    if args.step:
        print(json.dumps(step(args.step, args.bucket, args.mib)))
        return

    from kinetic_airflow.testing.gcs import FakeGCS

    with FakeGCS() as server:
        env = {**os.environ, **server.environ()}
        os.environ.update(server.environ())
        server.create_bucket(args.bucket)
        _run_step("prepare", args.bucket, args.mib, env)
        results: dict[str, list[dict]] = {}
        for _ in range(args.repeat):  # interleaved so drift hits both sides alike
            for mode in ("raw-upload", "kinetic-upload", "raw-download", "kinetic-download"):
                results.setdefault(mode, []).append(_run_step(mode, args.bucket, args.mib, env))
    print(f"object: {args.mib} MiB numpy float64 array, {args.repeat} runs each, median shown")
    summary = {}
    for mode, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        peak = max(r["peak_over_size"] for r in runs)
        summary[mode] = (seconds, peak)
        print(
            f"  {mode:17s} {seconds:6.2f} s  {args.mib / seconds:7.1f} MiB/s  peak memory {peak:4.2f}x object"
        )
    for side in ("upload", "download"):
        ratio = summary[f"raw-{side}"][0] / summary[f"kinetic-{side}"][0]
        print(f"{side} throughput ratio kinetic/raw: {ratio:.2f}  (target >= 0.9)")
    peak = max(summary["kinetic-upload"][1], summary["kinetic-download"][1])
    print(f"kinetic peak memory / object size: {peak:.2f}  (target <= 1.5)")
    raw_peak = max(summary["raw-upload"][1], summary["raw-download"][1])
    print(f"raw google-cloud-storage peak memory / object size: {raw_peak:.2f}")


if __name__ == "__main__":
    main()
