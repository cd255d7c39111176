"""What a run's TPU slices cost: the chip-hour ledger, optional prices, the budget guard and the orphan reaper.

Pure modules except ``operators`` (Airflow operators, cheap to import) and ``reaper`` (calls the
GKE, Kubernetes and Airflow APIs when it runs).
"""
