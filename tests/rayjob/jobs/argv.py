"""A Ray job that hands back the arguments it was started with."""

import json
import sys

print("TPUFLOW_RESULT " + json.dumps({"argv": sys.argv[1:]}))
