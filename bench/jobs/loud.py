"""A Ray job with a big driver log: MB megabytes at once, then a short line every 0.2 s for SECONDS.

python loud.py MB SECONDS
"""

import sys
import time

mb, seconds = float(sys.argv[1]), float(sys.argv[2])
line = "x" * 9999 + "\n"  # 10 kB lines: few enough that logging each one stays cheap
for _ in range(int(mb * 1e6 / len(line))):
    sys.stdout.write(line)
sys.stdout.flush()
print("LOUD_BULK_DONE", flush=True)
end = time.time() + seconds
i = 0
while time.time() < end:
    print(f"tick {i}", flush=True)
    i += 1
    time.sleep(0.2)
print('TPUFLOW_RESULT {"ticks": ' + str(i) + "}", flush=True)
