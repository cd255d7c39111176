"""A Ray job that prints a progress line every DELAY seconds for SECONDS (the triggerer-lag load).

python ticker.py SECONDS DELAY
"""

import sys
import time

seconds, delay = float(sys.argv[1]), float(sys.argv[2])
end = time.time() + seconds
i = 0
while time.time() < end:
    print(f"step {i} " + "." * 80, flush=True)
    i += 1
    time.sleep(delay)
print('TPUFLOW_RESULT {"steps": ' + str(i) + "}", flush=True)
