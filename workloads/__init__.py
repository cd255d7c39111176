"""Code that runs on the Ray cluster, shipped inside the tpuflow distribution as `tpuflow.workloads`.

This folder is a Ray job's and a Serve app's working_dir: its packages (`addition`,
`tpuflow_driver`) import each other as top-level modules there. The provider only locates the
folder (`tpuflow.workloads_dir()`); it never imports them.
"""
