"""A one-node Kubernetes cluster on loopback for the manifests and the consumer pod (``make cluster``; issue 35).

Repository-only, never shipped. Its parts and where they come from:

- the binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, runc, a pause
  binary) are built once from the Go module proxy by ``harness/cluster/build.sh`` into :func:`cache_dir` (outside
  the repository; a second start reuses them), pinned to :data:`K8S_VERSION`;
- containerd is Debian's (``apt-get install containerd``, 1.6), configured and run by the harness with its own
  socket, root and state under the cluster's folder (:func:`state_dir`);
- the custom resource definitions the overlays need (KEDA, the Prometheus operator, Strimzi) come from their
  package registries at pinned versions (:mod:`harness.cluster.crds`);
- the pods' network is a local bridge on a private subnet routed nowhere, through Debian's CNI plugins
  (``containernetworking-plugins``; :mod:`harness.cluster.network`).

:mod:`harness.cluster.node` starts and stops the processes, :mod:`harness.cluster.images` makes the pause image
and imports images into containerd, :mod:`harness.cluster.cli` is ``python -m harness.cluster``.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The Kubernetes release built and run (k8s.io/kubernetes; its staging modules at v0.<minor>.<patch>).
K8S_VERSION = "v1.34.4"
#: runc from the Go module proxy, built with ``-tags seccomp`` (Debian's 1.1.5 fails under containerd here).
RUNC_VERSION = "v1.4.4"
REPO = Path(__file__).resolve().parents[2]
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubectl",
    "runc",
    "pause",
)


def cache_dir() -> Path:
    """Where the built binaries and the fetched CRDs live, across clones and runs: ``STREAMINFER_K8S_CACHE`` or
    ``~/.cache/streaminfer/k8s``."""
    return Path(os.environ.get("STREAMINFER_K8S_CACHE", Path.home() / ".cache/streaminfer/k8s")).expanduser()


def bin_dir() -> Path:
    return cache_dir() / K8S_VERSION / "bin"


def state_dir() -> Path:
    """The running cluster's folder (configs, certificates, data, logs, kubeconfig): ``STREAMINFER_CLUSTER_DIR`` or
    ``.cluster/`` in the repository; ``make cluster-stop`` removes it."""
    return Path(os.environ.get("STREAMINFER_CLUSTER_DIR", REPO / ".cluster")).resolve()


def kubeconfig() -> Path:
    return state_dir() / "kubeconfig"


def binaries_cached() -> bool:
    """True when every binary is in the cache (so starting needs no build)."""
    return all((bin_dir() / name).is_file() for name in BINARIES)
