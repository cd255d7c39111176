"""Framework-neutral entrypoints that tpuflow submits as Ray jobs."""
