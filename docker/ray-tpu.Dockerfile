# Ray on TPU hosts (KubeRay TPU worker group), carrying the pipeline's workloads/.
# Build from the repository root:
#   docker build -f docker/ray-tpu.Dockerfile -t REGION-docker.pkg.dev/PROJECT/tpuflow/ray-tpu:0.1.0 .
# The Ray version in the tag must equal ray== in requirements.lock (checked by tests/docker).
FROM rayproject/ray:2.60.0-py311-tpu

# JAX for TPU (libtpu) and the workloads' libraries, at the lock's versions.
COPY requirements.lock /tmp/tpuflow-requirements.lock
RUN pip install --no-cache-dir -c /tmp/tpuflow-requirements.lock "jax[tpu]" jaxlib optax pyarrow \
    && rm /tmp/tpuflow-requirements.lock

# Serve apps and Ray jobs use working_dir local:///home/ray/workloads (the GKE DAG's default).
COPY --chown=ray:users workloads /home/ray/workloads
ENV PYTHONPATH=/home/ray/workloads
