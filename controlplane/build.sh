#!/usr/bin/env bash
# Build the real control plane's binaries (issue 46) into DEST (default .controlplane/bin under the repository):
#   tpuflow-kube      etcd, kube-apiserver, kube-controller-manager, kube-scheduler (controlplane/kube)
#   kuberay-operator  the KubeRay operator and the CRDs of the same module version (controlplane/kuberay)
# A build is kept in $TPUFLOW_CONTROLPLANE_CACHE (default ~/.cache/tpuflow/controlplane), keyed by the Go
# version and every input file, and copied from there when present: a fresh clone on a machine that built the
# same pins once takes seconds, not the ~15 CPU-minutes of a cold build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${1:-$here/../.controlplane/bin}"
cache_root="${TPUFLOW_CONTROLPLANE_CACHE:-$HOME/.cache/tpuflow/controlplane}"
command -v go >/dev/null || { echo "controlplane: Go is not installed (the real control plane is built from Go modules; Go 1.26 needed)" >&2; exit 1; }
mkdir -p "$dest"

key_of() {  # the Go version, this script and the module's own files decide the binary (not the clone's folder)
  { go version; sha256sum < "$here/build.sh"
    (cd "$here/$1" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 | sort -z | xargs -0 sha256sum); } \
    | sha256sum | cut -c1-16
}

build() {  # build NAME from module DIR with extra -ldflags and the package, unless the cache has it
  local name=$1 dir=$2 ldflags=$3; shift 3
  local cached="$cache_root/$dir-$(key_of "$dir")"
  if [ ! -x "$cached/$name" ]; then
    echo "controlplane: building $name from controlplane/$dir (Go modules; a cold build takes minutes)" >&2
    local tmp; tmp="$(mktemp -d "$cache_root.tmp.XXXXXX" 2>/dev/null || { mkdir -p "$(dirname "$cache_root")"; mktemp -d "$cache_root.tmp.XXXXXX"; })"
    (cd "$here/$dir" && go build -trimpath -buildvcs=false -ldflags="-s -w $ldflags" -o "$tmp/$name" "$@")
    mkdir -p "$cached" && mv "$tmp/$name" "$cached/$name" && rmdir "$tmp"
  fi
  cp -f "$cached/$name" "$dest/$name.tmp" && mv -f "$dest/$name.tmp" "$dest/$name"
}

# Kubernetes' own build stamps its version (hack/lib/version.sh); without it the binaries call themselves
# v0.0.0-master and clients see no server version.
kube_version="$(cd "$here/kube" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
minor="$(echo "$kube_version" | cut -d. -f2)"
v=k8s.io/component-base/version
kube_ldflags="-X $v.gitVersion=$kube_version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
build tpuflow-kube kube "$kube_ldflags" ./cmd/tpuflow-kube
build kuberay-operator kuberay "" github.com/ray-project/kuberay/ray-operator

# The CRDs and the operator's ClusterRole of the operator's own version, from the module it was built from.
module="$(cd "$here/kuberay" && go list -m -f '{{.Dir}}' github.com/ray-project/kuberay/ray-operator)"
mkdir -p "$dest/../crds" "$dest/../rbac"
cp -f "$module"/config/crd/bases/ray.io_*.yaml "$dest/../crds/" && chmod u+w "$dest/../crds"/*.yaml
cp -f "$module/config/rbac/role.yaml" "$dest/../rbac/kuberay-operator-role.yaml" && chmod u+w "$dest/../rbac"/*.yaml
echo "controlplane: $(cd "$dest" && pwd): $(ls "$dest" | tr '\n' ' ')" >&2
