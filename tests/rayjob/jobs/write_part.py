"""A prep-like Ray job: writes one new uniquely named file into --output-dir, as Ray Data's writers do."""

import sys
import uuid
from pathlib import Path

from tpuflow_driver.result import emit_result

folder = Path(sys.argv[sys.argv.index("--output-dir") + 1]) / "train"
folder.mkdir(parents=True, exist_ok=True)
(folder / f"part-{uuid.uuid4().hex}.parquet").write_text("rows")
emit_result({})
