import sys

from operators.cli import main

sys.exit(main())
