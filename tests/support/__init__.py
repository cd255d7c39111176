"""Helpers shared by the test folders (imported as ``support.<module>``: tests/conftest.py puts tests/ on sys.path).

Not here, because they must stay files at a fixed path: job scripts Ray runs (tests/rayjob/jobs),
DAG files (tests/airflow_services/dags), the Serve app a Ray cluster imports by name
(tests/kuberay/serve_echo_app.py), driver scripts (tests/local/drivers), and
tests/packaging/installed_ray_steps.py, which runs in a venv holding only the wheel.
"""
