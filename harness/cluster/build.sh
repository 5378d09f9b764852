#!/usr/bin/env bash
# Builds the one-node cluster's binaries from the Go module proxy into a cache outside the repository, once:
# k8s.io/kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl) inside a wrapper
# module that replaces each staging module (required there at v0.0.0) with its published v0.<minor>.<patch>;
# etcd from go.etcd.io/etcd/server/v3 (the version k8s.io/kubernetes itself requires); runc with -tags seccomp
# (Debian's runc 1.1.5 fails under containerd here with "can't get final child's PID from pipe").
# Each binary already in the cache is kept; each build runs under the shared heavy-build lock, niced.
# Usage: build.sh CACHE_DIR  (env: K8S_VERSION, RUNC_VERSION, HEAVY_LOCK)
set -euo pipefail
cache=${1:?usage: build.sh CACHE_DIR}
k8s=${K8S_VERSION:-v1.34.4}
runc_version=${RUNC_VERSION:-v1.4.4}
lock=${HEAVY_LOCK:-/work/wt/heavy.lock}
staging=v0.${k8s#v1.}
src=$cache/src bin=$cache/bin
mkdir -p "$src/cmd/etcd" "$bin"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=${CGO_ENABLED:-1}
proxy=${GOPROXY:-https://proxy.golang.org}; proxy=${proxy%%,*}

heavy() { if [[ -e $lock || -d $(dirname "$lock") ]]; then flock "$lock" nice -n 10 "$@"; else nice -n 10 "$@"; fi; }

if [[ ! -s $src/go.mod ]]; then
    curl -fsS "$proxy/k8s.io/kubernetes/@v/$k8s.mod" -o "$src/kubernetes.mod"
    {
        printf 'module streaminfer.local/k8sbuild\n\ngo 1.24.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$k8s"
        awk -v v="$staging" '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print "\t" $1 " => " $1 " " v}' "$src/kubernetes.mod"
        printf ')\n'
    } > "$src/go.mod.new"
    printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' \
        > "$src/cmd/etcd/main.go"
    mv "$src/go.mod.new" "$src/go.mod"
fi

minor=${k8s#v1.}; minor=${minor%%.*}
stamp="-X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1"
stamp+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
stamp+=" -X k8s.io/client-go/pkg/version.gitVersion=$k8s -X k8s.io/client-go/pkg/version.gitMajor=1"
stamp+=" -X k8s.io/client-go/pkg/version.gitMinor=$minor"

# One go build for every missing binary of etcd and Kubernetes (one wait for the lock; the linker runs in parallel).
names=(etcd kubectl kube-apiserver kube-scheduler kube-controller-manager kubelet)
packages=(./cmd/etcd k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kube-apiserver
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubelet)
missing=()
for i in "${!names[@]}"; do
    if [[ -x $bin/${names[$i]} ]]; then echo "cached: $bin/${names[$i]}"; else missing+=("${packages[$i]}"); fi
done
if (( ${#missing[@]} )); then
    t0=$SECONDS
    (cd "$src" && go mod download k8s.io/kubernetes)
    rm -rf "$cache/out" && mkdir -p "$cache/out"
    (cd "$src" && heavy go build -trimpath -ldflags="-s -w $stamp" -o "$cache/out/" "${missing[@]}")
    for f in "$cache/out"/*; do mv "$f" "$bin/$(basename "$f")"; done
    echo "built: ${missing[*]} in $((SECONDS - t0)) s"
fi
if [[ ! -x $bin/runc ]]; then
    t0=$SECONDS
    mkdir -p "$cache/runc-gobin"
    (cd "$cache" && GOFLAGS= GOBIN="$cache/runc-gobin" heavy go install -trimpath -tags seccomp \
        -ldflags="-s -w -X main.version=${runc_version#v}" "github.com/opencontainers/runc@$runc_version")
    mv "$cache/runc-gobin/runc" "$bin/runc"
    echo "built: $bin/runc in $((SECONDS - t0)) s"
fi
echo "$k8s" > "$bin/VERSION"
if [[ ! -x $bin/pause ]]; then  # the pod sandbox's process, static (harness/cluster/pause/main.go)
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    mkdir -p "$src/cmd/pause"
    cp "$here/pause/main.go" "$src/cmd/pause/main.go"
    (cd "$src" && CGO_ENABLED=0 heavy go build -trimpath -ldflags="-s -w" -o "$bin/pause.part" ./cmd/pause)
    mv "$bin/pause.part" "$bin/pause"
    echo "built: $bin/pause"
fi
