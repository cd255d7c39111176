"""Ray jobs on a cluster: submit, follow, re-attach (operators, hooks, triggers and their waits)."""

# How long a job's wait bears a Ray dashboard that does not answer before it fails, retryable (the retry reaches the
# cluster where it is now and re-attaches): here, so the operator's default costs a DAG file no import of the waits.
UNREACHABLE_TIMEOUT_S = 300.0
