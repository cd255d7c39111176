"""The environment local Ray nodes inherit from the process that starts them: an allowlist, never all of it.

Everything a Ray node has, every Ray job on it has too (job drivers and workers are the raylet's
children). The process that starts a local cluster is an Airflow worker, ``tpuflow airflow up`` or a
user's shell: its environment carries the Airflow JWT secret and Fernet key (``AIRFLOW__*``), connection
URIs with passwords (``AIRFLOW_CONN_*``) and whatever else the user exported. A node gets only what Ray,
the interpreter and the workloads read; the cluster's own settings (RAY_*, TPU_*) are added by the
cluster, and ``env=`` passes anything else explicitly. With a GCS emulator configured, a node also gets what
points every client library at it (tpuflow.storage.emulator_env), so plain gs:// code on the cluster, in a
job tpuflow did not start too, reaches the emulator.
"""

from __future__ import annotations

from collections.abc import Mapping

from tpuflow.storage import emulator_env

# Exact names a node inherits: the interpreter, locale and temp dir, the virtual environment, proxies and CA
# bundles (GCS and model downloads go through them), Google credentials, the GCS emulator and the GCE metadata
# stand-in beside it (tpuflow.storage.emulator_env's names).
INHERITED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "TZ",
        "LANG",
        "LANGUAGE",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "STORAGE_EMULATOR_HOST",
        "CLOUD_STORAGE_EMULATOR_ENDPOINT",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
        "GCE_METADATA_HOST",
        "GCE_METADATA_IP",
        "GCE_METADATA_ROOT",
        "OMP_NUM_THREADS",
    }
)
# Prefixes a node inherits: locale, the workloads' and tpuflow's own settings, JAX/XLA, Google Cloud client
# settings (GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_CLOUD_PROJECT, CLOUDSDK_*), Hugging Face model downloads.
INHERITED_PREFIXES = ("LC_", "TPUFLOW_", "JAX_", "XLA_", "GOOGLE_", "CLOUDSDK_", "HF_")
# Never inherited, whatever the lists above say: Airflow's configuration and secrets (AIRFLOW__*, AIRFLOW_CONN_*,
# AIRFLOW_VAR_*), and the launching process's own Ray and TPU settings (the cluster sets its own).
NEVER_PREFIXES = ("AIRFLOW", "RAY_", "TPU_")


def inherited(name: str) -> bool:
    """Whether a Ray node inherits variable ``name`` from the process that starts it."""
    if name.upper().startswith(NEVER_PREFIXES):
        return False
    return name in INHERITED_NAMES or name.startswith(INHERITED_PREFIXES)


def node_environment(source: Mapping[str, str]) -> dict[str, str]:
    """The part of ``source`` (the launching process's environment) a local Ray node inherits, with the client
    libraries' emulator variables derived from it when it names a GCS emulator."""
    return {**{name: value for name, value in source.items() if inherited(name)}, **emulator_env(source)}
