"""A Ray job that hands back the arguments it was started with."""

import sys

from tpuflow_driver.result import emit_result

emit_result({"argv": sys.argv[1:]})
