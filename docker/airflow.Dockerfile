# Airflow 3.3 with tpuflow (api-server, scheduler, dag-processor, triggerer, workers: one image).
# Build from the repository root:
#   docker build -f docker/airflow.Dockerfile -t REGION-docker.pkg.dev/PROJECT/tpuflow/airflow:0.1.0 .
# The base tag, the Python version and apache-airflow==3.3.2 in requirements.lock must agree
# (tests/docker/test_dockerfiles.py checks it).
FROM apache/airflow:3.3.2-python3.11

# Everything pinned by the project's lock (Airflow itself included, so pip changes nothing of it).
COPY --chown=airflow:0 requirements.lock /opt/tpuflow/requirements.lock
RUN pip install --no-cache-dir -r /opt/tpuflow/requirements.lock

# The project, installed as a wheel the way Composer installs it: the `tpuflow` package (from
# operators/; triggers must be importable by the triggerer from the installed package, never from
# the DAGs folder) with the Ray workloads inside it (tpuflow.workloads), then DAGs and the UI plugin.
COPY --chown=airflow:0 pyproject.toml README.md /opt/tpuflow/
COPY --chown=airflow:0 operators /opt/tpuflow/operators
COPY --chown=airflow:0 workloads /opt/tpuflow/workloads
RUN pip install --no-cache-dir --no-deps /opt/tpuflow && rm -rf /opt/tpuflow/operators /opt/tpuflow/workloads
COPY --chown=airflow:0 dags /opt/airflow/dags
COPY --chown=airflow:0 plugins /opt/airflow/plugins

ENV AIRFLOW__CORE__LOAD_EXAMPLES=False
