# Ray on TPU hosts (KubeRay TPU worker group), carrying the pipeline's workloads/.
# Build from the repository root:
#   docker build -f docker/ray-tpu.Dockerfile -t REGION-docker.pkg.dev/PROJECT/tpuflow/ray-tpu:0.1.0 .
# The Ray version in the tag must equal ray== in requirements.lock (checked by tests/docker).
FROM rayproject/ray:2.60.0-py311-tpu

# The workloads' libraries: pyproject's [jax] extra (JAX for TPU: jax[tpu], with libtpu) and pyarrow at the
# lock's versions, then its [torch] extra as the CPU build, as `make install` does (the lock leaves torch out;
# the head runs the TorchTrainer driver, the workers torch_backend "gloo"). Not `pip install .[jax,torch]`: that
# also installs the provider's core dependencies, Airflow among them, which a Ray image never runs.
COPY requirements.lock /tmp/tpuflow-requirements.lock
RUN pip install --no-cache-dir -c /tmp/tpuflow-requirements.lock "jax[tpu]" jaxlib optax pyarrow \
    && pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
    && rm /tmp/tpuflow-requirements.lock

# Serve apps and Ray jobs use working_dir local:///home/ray/workloads (the GKE DAG's default).
COPY --chown=ray:users workloads /home/ray/workloads
ENV PYTHONPATH=/home/ray/workloads
