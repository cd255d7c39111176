"""A Ray job that prints a progress line every DELAY seconds for SECONDS (the triggerer-lag load).

python ticker.py SECONDS DELAY [TAG [UNTIL]]

TAG is ignored (the bench finds a run's job by it in the entrypoint); UNTIL, an epoch time, keeps the job
running until then, so that many jobs started at different times end together.
"""

import sys
import time

seconds, delay = float(sys.argv[1]), float(sys.argv[2])
end = max(time.time() + seconds, float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
i = 0
while (left := end - time.time()) > 0:
    print(f"step {i} " + "." * 80, flush=True)
    i += 1
    time.sleep(min(delay, left))
print('TPUFLOW_RESULT {"steps": ' + str(i) + "}", flush=True)
