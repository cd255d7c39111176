"""`python -m tpuflow_rehearsal.standins.kuberay_controller`: serve the stand-in until SIGTERM."""

from tpuflow_rehearsal.standins.kuberay_controller.standin import main

raise SystemExit(main())
