"""tpuflow: Airflow operators that train and serve models with Ray on Cloud TPU slices."""

__version__ = "0.1.0"
