# Airflow 3.3 with tpuflow (api-server, scheduler, dag-processor, triggerer, workers: one image).
# Build from the repository root:
#   docker build -f docker/airflow.Dockerfile -t REGION-docker.pkg.dev/PROJECT/tpuflow/airflow:0.1.0 .
# The base tag, the Python version and apache-airflow==3.3.2 in requirements.lock must agree
# (tests/docker/test_dockerfiles.py checks it).
FROM apache/airflow:3.3.2-python3.11

# The project, installed as a wheel the way Composer installs it: the `tpuflow` package (from
# operators/; triggers must be importable by the triggerer from the installed package, never from
# the DAGs folder) with the Ray workloads inside it (tpuflow.workloads), then DAGs and the UI plugin.
# Its own dependencies only, at the lock's versions: the lock constrains (-c), it does not add, so the
# [jax] and [dev] packages it also pins (for the project's own installs) stay out of the Airflow image;
# Airflow itself stays the base image's (the lock pins the same version, checked by the test).
COPY --chown=airflow:0 requirements.lock pyproject.toml README.md /opt/tpuflow/
COPY --chown=airflow:0 operators /opt/tpuflow/operators
COPY --chown=airflow:0 workloads /opt/tpuflow/workloads
RUN pip install --no-cache-dir -c /opt/tpuflow/requirements.lock /opt/tpuflow \
    && rm -rf /opt/tpuflow/operators /opt/tpuflow/workloads
COPY --chown=airflow:0 dags /opt/airflow/dags
COPY --chown=airflow:0 plugins /opt/airflow/plugins

ENV AIRFLOW__CORE__LOAD_EXAMPLES=False
