from importlib.resources import files

"""tpuflow: Airflow operators that train and serve models with Ray on Cloud TPU slices."""

__version__ = "0.1.0"


def workloads_dir() -> str:
    """The folder of code that runs on Ray (a job's or Serve app's working_dir), wherever the
    distribution is installed: the checkout's workloads/ for an editable install, the wheel's copy
    in site-packages otherwise."""

    return str(files("tpuflow.workloads"))
