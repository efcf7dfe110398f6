"""Provider metadata read by every Airflow process: a plain dict, no heavy imports."""


def get_provider_info() -> dict:
    def option(description: str, example: str | None, type_: str = "string") -> dict:
        return {
            "description": description,
            "version_added": "0.1.0",
            "type": type_,
            "example": example,
            "default": None,
        }

    info = {
        "package-name": "kinetic-airflow",
        "name": "Kinetic",
        "description": "Run Python functions on TPUs and GPUs (GKE) or locally, with @task.kinetic.",
        "versions": ["0.1.0"],
        "task-decorators": [{"name": "kinetic", "class-name": "kinetic_airflow.decorators.kinetic_task"}],
        "extra-links": [
            "kinetic_airflow.links.KineticJobConsoleLink",
            "kinetic_airflow.links.KineticJobLogsLink",
            "kinetic_airflow.links.KineticViewLink",
        ],
        "config": {
            "kinetic": {
                "description": "Defaults for @task.kinetic / KineticRunOperator. A task argument wins over "
                "these; these win over KINETIC_* environment variables.",
                "options": {
                    "backend": option("Where jobs run: local, gke, pathways or auto (default local).", "gke"),
                    "base_uri": option(
                        "Where job files live: gs://bucket/prefix or file:///path. Default: a local cache "
                        "directory for local, gs://{project}-kn-{cluster}-jobs otherwise.",
                        "gs://my-bucket/kinetic",
                    ),
                    "project": option("GCP project of the cluster and bucket.", "my-project"),
                    "zone": option("Cluster location (default us-central1-a).", "us-central1-a"),
                    "cluster": option("GKE cluster name (default kinetic-cluster).", "kinetic-cluster"),
                    "namespace": option("Kubernetes namespace of jobs (default default).", "ml"),
                    "container_image": option(
                        "Runner image for cluster jobs of every accelerator kind without its own "
                        "container_image_KIND (default: the image `kinetic-airflow image --kind KIND` "
                        "pushes, tagged with this provider's version and the workers' Python).",
                        "us-docker.pkg.dev/p/r/kinetic-airflow-runner-cpu:0.1.0-py3.11",
                    ),
                    **{
                        f"container_image_{kind}": option(
                            f"Runner image for {kind.upper()} jobs; wins over container_image (a task's "
                            "container_image= wins over both).",
                            f"us-docker.pkg.dev/p/r/kinetic-airflow-runner-{kind}:0.1.0-py3.11",
                        )
                        for kind in ("cpu", "gpu", "tpu")
                    },
                    "worker_python": option(
                        "The Airflow workers' Python major.minor, for the images `kinetic-airflow image` "
                        "builds (default: the Python running the command).",
                        "3.11",
                    ),
                    "gcp_conn_id": option(
                        "Airflow GCP connection for storage and GKE (default google_cloud_default when "
                        "defined, else ambient credentials).",
                        "google_cloud_default",
                    ),
                    "poll_interval": option("Seconds between job status checks (default 2).", "5", "float"),
                    "heartbeat_seconds": option("Runner heartbeat period (default 30).", "30", "float"),
                    "metrics_interval": option(
                        "Seconds between a job's writes of the metrics kinetic_airflow.report() buffered: "
                        "at most one storage write per interval, whatever the report rate (default 5).",
                        "5",
                        "float",
                    ),
                    "xcom_max_bytes": option(
                        "Results larger than this stay in storage; XCom gets a reference (default 262144).",
                        "1048576",
                        "integer",
                    ),
                    "requirements_cache": option(
                        "Where cluster nodes cache the environments of requirements=: hostpath (a node "
                        "folder every job on the node reuses), emptydir (per pod) or auto (emptydir on "
                        "GKE Autopilot, which refuses writable hostPath volumes; hostpath elsewhere).",
                        "auto",
                    ),
                    "log_max_lines": option(
                        "Job log lines copied into the task log per job (default 10000).", "10000", "integer"
                    ),
                    "kubernetes_conn_id": option(
                        "Kubernetes connection for clusters other than GKE (default: use GKE through the "
                        "GCP connection).",
                        "kubernetes_default",
                    ),
                    "use_internal_ip": option(
                        "Reach the GKE control plane on its private endpoint "
                        "(private_cluster_config.private_endpoint): for Airflow inside the cluster's VPC "
                        "or a Composer 3 network attachment (default false).",
                        "true",
                        "boolean",
                    ),
                    "use_dns_endpoint": option(
                        "Reach the GKE control plane on its DNS endpoint "
                        "(control_plane_endpoints_config.dns_endpoint_config.endpoint; default false).",
                        "true",
                        "boolean",
                    ),
                    "impersonation_chain": option(
                        "Service account(s) to impersonate for the GKE and Kubernetes API calls, comma "
                        "separated; the last one is the identity used, the ones before it delegates "
                        "(default none).",
                        "kinetic-airflow@my-project.iam.gserviceaccount.com",
                    ),
                    "service_account": option(
                        "Kubernetes service account of job pods (default kinetic).", "kinetic"
                    ),
                    "capacity": option(
                        "Where cluster jobs' nodes come from: on-demand, spot, flex-start, queued, "
                        "reservation:<name>, reservation:<project>/<name> or any-reservation "
                        "(default on-demand).",
                        "flex-start",
                    ),
                    "max_run_duration": option(
                        "Seconds a flex-start or queued job's VMs may run, at most 604800 (7 days, "
                        "GKE's limit; default GKE's).",
                        "43200",
                        "float",
                    ),
                    "local_queue": option(
                        "Kueue LocalQueue of cluster jobs, in the job's namespace (default none).",
                        "team-a",
                    ),
                    "priority_class": option(
                        "Kueue WorkloadPriorityClass of queued jobs (default none).", "high"
                    ),
                    "queue_timeout": option(
                        "Seconds a job may wait in its Kueue queue before it fails (default no bound).",
                        "7200",
                        "float",
                    ),
                    "startup_timeout": option(
                        "Seconds a job may stay unschedulable before failing (default 1800: room for "
                        "accelerator node scale-up).",
                        "1800",
                        "float",
                    ),
                    "heartbeat_timeout": option(
                        "A running job whose runner heartbeat is older than this is treated as lost "
                        "(default 300).",
                        "300",
                        "float",
                    ),
                    "preemption_retries": option(
                        "Resubmissions of a preempted job, not counted as Airflow retries (default 3).",
                        "3",
                        "integer",
                    ),
                    "wait_before_defer": option(
                        "Seconds a task waits in the worker for its job before deferring (default 5): "
                        "a short job then costs one task process instead of two and no resume latency.",
                        "5",
                        "float",
                    ),
                    "resume_margin_seconds": option(
                        "A deferred task's completion is held until the process that deferred it has "
                        "exited plus this margin (default 2): the executor reports that exit and the "
                        "scheduler reads it within one loop, away from Airflow's executor-event race.",
                        "2",
                        "float",
                    ),
                    "watch_deferring_process": option(
                        "Hold a deferred task's completion until the process that deferred it has "
                        "exited, seen through /proc when the triggerer shares its host and PID "
                        "namespace (default true); false always holds for min_deferral_seconds.",
                        "true",
                        "boolean",
                    ),
                    "min_deferral_seconds": option(
                        "Where the triggerer cannot see the process that deferred a task (another host "
                        "or PID namespace), its completion is held until it has been deferred this long "
                        "(default: 2 x [workers] min_heartbeat_interval + 5 s), so Airflow has processed "
                        "the deferring process's exit before the task resumes.",
                        "15",
                        "float",
                    ),
                    "storage_retry_seconds": option(
                        "How long a task watching its job retries failing job storage (reads of the "
                        "result, heartbeat and markers; a bucket's 5xx, a network blip, a read-only "
                        "disk) before it stops the job and fails (default 180). Writes of the log "
                        "cursor and progress are best-effort and never fail a task.",
                        "600",
                        "float",
                    ),
                    "runner_python": option("Interpreter in the runner image (default python).", "python3"),
                    "retention_days": option(
                        "Default age for `kinetic-airflow gc` and the kinetic_maintenance DAG: job files "
                        "older than this many days are deleted (never a live job's, never a result an XCom "
                        "still references). Unset: gc needs --older-than.",
                        "30",
                        "integer",
                    ),
                    "pod_override": option(
                        "A pod override (JSON, Kubernetes field names) merged over every cluster job's pod "
                        "before the task's own pod_override; see the README.",
                        '{"spec": {"imagePullSecrets": [{"name": "regcred"}]}}',
                    ),
                    "kinetic_interop": option(
                        "Write keras-kinetic's handle.json (and its result.pkl) for cluster jobs in a "
                        "kinetic bucket ({project}-kn-{cluster}-jobs), so `kinetic jobs list` sees them "
                        "(default true).",
                        "true",
                        "boolean",
                    ),
                    "local_python": option(
                        "Interpreter for local jobs (default: the worker's).", "/usr/bin/python3"
                    ),
                    "local_state_dir": option(
                        "Where local jobs keep pid/exit/log files when storage is gs:// "
                        "(default ~/.cache/kinetic-airflow/local).",
                        "/var/lib/kinetic",
                    ),
                },
            }
        },
    }
    _declare_defaults(info["config"]["kinetic"]["options"])
    return info


def _declare_defaults(options: dict) -> None:
    """The built-in defaults (``kinetic_airflow.config.DEFAULTS``, a dict in a light module), so that
    ``airflow config list --section kinetic`` and ``airflow config get-value kinetic backend`` show
    them. Options whose default is derived (base_uri, project, ...) stay empty: their description
    says how the value is found."""
    # Start-up cost: the providers manager imports this module in every process.
    from kinetic_airflow.config import DEFAULTS

    for name, option in options.items():
        value = DEFAULTS.get(name)
        if value is None:
            continue
        if isinstance(value, bool):
            option["default"] = str(value).lower()
        else:
            option["default"] = f"{value:g}" if isinstance(value, float) else str(value)
