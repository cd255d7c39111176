"""The steps the local and the GKE pipelines share, in their order (tpuflow.pipeline.factory builds both)."""

from __future__ import annotations

# the local pipeline's: its training workers evaluate after the last step (Workload.evaluate_in_training)
TRAIN_TO_REPORT = ["train", "build_serve_config", "deploy", "smoke_test", "write_report"]
# the GKE pipeline's: an evaluate job on the CPU cluster, once the training slice is deleted
GKE_TRAIN_TO_REPORT = ["train", "evaluate", *TRAIN_TO_REPORT[1:]]
