"""What the Airflow UI shows beyond the operators' own extra links (see plugins/tpuflow_plugin.py)."""
