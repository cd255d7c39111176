"""`python -m tpuflow.dev.standins.kuberay_controller`: serve the stand-in until SIGTERM."""

from tpuflow.dev.standins.kuberay_controller.standin import main

raise SystemExit(main())
