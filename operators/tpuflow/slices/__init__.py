"""Slice leases: at most N TPU slices in use at once, whatever starts the runs (schedule, UI, backfill)."""
