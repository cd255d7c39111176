"""A small Ray job: prints progress lines over time, then its result (or fails on request)."""

import sys
import time

from tpuflow_driver.result import emit_result

steps, delay, fail = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "fail"
for i in range(steps):
    print(f"step {i}", flush=True)
    time.sleep(delay)
if fail:
    raise ValueError("the user's code is broken")
emit_result({"steps": steps, "accuracy": 0.5})
