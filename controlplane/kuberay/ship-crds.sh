#!/usr/bin/env bash
# Copy KubeRay's CRDs of the operator version pinned in controlplane/kuberay/go.mod into the package
# (rehearsal/tpuflow_rehearsal/standins/kuberay_crds: gzipped, with the version and KubeRay's licence), where the
# imitation control plane reads them by default. Run it after changing the pin;
# tests/rehearsal/standins/test_kuberay_crds.py fails until the shipped CRDs are those of the pinned version.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="$here/../../rehearsal/tpuflow_rehearsal/standins/kuberay_crds"
module="$(cd "$here" && go list -m -f '{{.Dir}}' github.com/ray-project/kuberay/ray-operator)"
version="$(cd "$here" && go list -m -f '{{.Version}}' github.com/ray-project/kuberay/ray-operator)"
rm -f "$dest"/ray.io_*.yaml.gz
for crd in "$module"/config/crd/bases/ray.io_*.yaml; do
  gzip -9 -n -c "$crd" > "$dest/$(basename "$crd").gz"  # -n: no name or time stamp, the same bytes each run
done
cp -f "$module/LICENSE" "$dest/LICENSE" && chmod u+w "$dest/LICENSE"
echo "$version" > "$dest/VERSION"
echo "kuberay_crds: $version: $(cd "$dest" && ls ray.io_*.yaml.gz | tr '\n' ' ')" >&2
