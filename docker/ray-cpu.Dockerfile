# Ray head node (CPU; num-cpus 0 on GKE) with the same workloads/ as the TPU workers.
# Build from the repository root:
#   docker build -f docker/ray-cpu.Dockerfile -t REGION-docker.pkg.dev/PROJECT/tpuflow/ray-cpu:0.1.0 .
# The Ray version in the tag must equal ray== in requirements.lock (checked by tests/docker).
FROM rayproject/ray:2.60.0-py311-cpu

# Job drivers run on the head: the workloads' libraries, pyproject's [jax] extra (CPU JAX) and pyarrow at the
# lock's versions, then its [torch] extra as the CPU build (a TorchTrainer driver imports torch), as in
# ray-tpu.Dockerfile; not `pip install .[jax,torch]`, which would also bring Airflow.
COPY requirements.lock /tmp/tpuflow-requirements.lock
RUN pip install --no-cache-dir -c /tmp/tpuflow-requirements.lock jax jaxlib optax pyarrow \
    && pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
    && rm /tmp/tpuflow-requirements.lock

COPY --chown=ray:users workloads /home/ray/workloads
ENV PYTHONPATH=/home/ray/workloads
