"""`python -m operators.standins.kuberay_controller`: serve the stand-in until SIGTERM."""

from operators.standins.kuberay_controller.standin import main

raise SystemExit(main())
