"""The rehearsal's `tpuflow` commands (demo, run, airflow, standins, local gcs), found by the provider's command line
through the entry-point group ``tpuflow.commands`` (rehearsal/pyproject.toml)."""
