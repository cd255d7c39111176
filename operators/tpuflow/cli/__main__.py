import sys

from tpuflow.cli import main

sys.exit(main())
