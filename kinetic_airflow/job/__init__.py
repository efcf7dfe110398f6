"""What runs inside a job, and the files it shares with the scheduler side: no Airflow here.

A job pod has Python, cloudpickle and google-cloud-storage (``pip install --no-deps
kinetic-airflow`` plus the ``runner`` extra), not Airflow: every module of this package
imports only the standard library, those two and other modules of this package
(tests/test_import_graph.py checks it). The operator, trigger, view and CLI import from here;
nothing here imports from them.

layout        where a job's files are (one place names them)
storage       file:// and gs:// behind one small interface
payload       the pickled function and arguments
envelope      the result file and references to large results
tracebacks    remote tracebacks that point at the user's own lines
codebundle    the DAG folder's code shipped with a job
requirements  the job's Python environment (a cached venv)
inputs        ``Data``: files and gs:// URIs a job needs on its disk
interop       keras-kinetic's handle and result files
accelerators  accelerator strings -> the hardware they name (``AcceleratorSpec``); re-exported
              as ``kinetic_airflow.accelerators``
ref           the job reference every party names a job by (``JobRef``) and its JSON form
multihost     JAX's multi-controller start-up inside a multi-host job
runner        the entry point a pod runs (``python -m kinetic_airflow.runner``)
"""
