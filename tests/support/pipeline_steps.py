"""The steps the local and the GKE pipelines share, in their order (tpuflow.pipeline.factory builds both)."""

from __future__ import annotations

TRAIN_TO_REPORT = ["train", "evaluate", "build_serve_config", "deploy", "smoke_test", "write_report"]
