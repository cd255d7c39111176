"""Every performance claim of the project, measured against its baseline in the same run.

    .venv/bin/python -m bench [--quick] [--only NAME ...]      (make bench: the full set)

Writes bench/results/latest.json, latest.md and PNG charts; see bench/README.md.
"""
