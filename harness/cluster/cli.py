"""``python -m harness.cluster VERB``: the one-node cluster of :mod:`harness.cluster` (``make cluster``,
``make cluster-stop``, ``make test-cluster``).

Verbs:
  build         build the binaries into the cache where missing (``harness/cluster/build.sh``; cold: ~10 min on
                2 cores, under the heavy-build lock)
  start         build where needed (``--no-build``: exit 3 instead), start the cluster, install the CRDs; prints
                ``export KUBECONFIG=...`` last
  stop          stop everything ``start`` started and remove what it wrote
  status        exit 0 while the cluster runs, 1 otherwise
  cached        exit 0 when every binary is cached (CI builds nothing cold), 1 otherwise
  crds          fetch the pinned CRDs (KEDA, Prometheus operator, Strimzi); print their folders
  import-image  carry a Docker engine's image into the cluster's containerd (``docker save | ctr images import``)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from harness.cluster import (
    K8S_VERSION,
    REPO,
    RUNC_VERSION,
    bin_dir,
    binaries_cached,
    cache_dir,
    crds,
    kubeconfig,
    node,
    state_dir,
)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def build() -> float:
    """Run build.sh for what is missing; seconds it took. Raises CalledProcessError when a build fails."""
    t0 = time.monotonic()
    env = {**os.environ, "K8S_VERSION": K8S_VERSION, "RUNC_VERSION": RUNC_VERSION}
    subprocess.run(["bash", str(REPO / "harness/cluster/build.sh"), str(bin_dir().parent)], check=True, env=env)
    return time.monotonic() - t0


def install_crds() -> float:
    """Server-side apply every fetched CRD and wait until each is Established; seconds it took."""
    t0 = time.monotonic()
    for folder in crds.fetch():
        node.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(folder), timeout_s=300)
        names = node.kubectl("get", "-f", str(folder), "-o", "name").stdout.split()
        node.kubectl("wait", "--for=condition=Established", "--timeout=120s", *names, timeout_s=150)
    return time.monotonic() - t0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="verb", required=True)
    sub.add_parser("build")
    s = sub.add_parser("start")
    s.add_argument("--no-build", action="store_true", help="exit 3 instead of building binaries that are missing")
    sub.add_parser("stop")
    sub.add_parser("status")
    sub.add_parser("cached")
    sub.add_parser("crds")
    i = sub.add_parser("import-image")
    i.add_argument("image")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.verb == "build":
        say(f"cluster: binaries ready in {build():.0f} s ({bin_dir()})")
    elif args.verb == "cached":
        return 0 if binaries_cached() else 1
    elif args.verb == "status":
        up = node.running()
        say(f"cluster: {'running' if up else 'not running'} (state {state_dir()})")
        return 0 if up else 1
    elif args.verb == "crds":
        for folder in crds.fetch():
            print(folder)
    elif args.verb == "stop":
        node.stop(log=say)
    elif args.verb == "import-image":
        say(f"cluster: {args.image} imported ({node_import(args.image):.0f} MB)")
    elif args.verb == "start":
        if not binaries_cached():
            if args.no_build:
                say(f"cluster: binaries of {K8S_VERSION} not cached in {cache_dir()}")
                return 3
            say(f"cluster: building {K8S_VERSION} into {bin_dir()} once (cold: ~10 min on 2 cores)")
            say(f"cluster: built in {build():.0f} s")
        try:
            times = node.start(log=say)
            times["crds"] = install_crds()
        except (node.ClusterError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            detail = getattr(e, "stderr", "") or ""
            say(f"cluster: start failed: {e}\n{detail}")
            return 1
        say("cluster: ready in " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
        print(f"export KUBECONFIG={kubeconfig()}")
    return 0


def node_import(image: str) -> float:
    from harness.cluster import images

    return images.import_docker_image(image)
