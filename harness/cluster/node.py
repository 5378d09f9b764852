"""Start and stop the one-node cluster: containerd, etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
kubelet, each a child process in its own session with its log in ``<state>/logs/`` and its pid in
``<state>/pids/``; everything bound to 127.0.0.1 on ports the kernel chose (:func:`harness.ports.free_port`).

What this kind of machine needs (tried in issue 35):

- kubelet: ``cgroupDriver: cgroupfs`` and ``failCgroupV1: false`` (cgroup v1, no systemd), node ``localhost``,
  ``makeIPTablesUtilChains: false`` (no kube-proxy runs, so no chain of the kubelet's is needed);
- pods: each in its own network namespace on a local bridge (:mod:`harness.cluster.network`: containerd's CRI with
  the CNI bridge plugin, a private subnet routed nowhere, the tests' broker at the bridge's address);
- containerd 1.6 (Debian): ``restrict_oom_score_adj = true`` (this VM forbids lowering ``oom_score_adj``), runc
  from the cache (built with seccomp), the pause image of :mod:`harness.cluster.images` as the sandbox image;
- kube-apiserver: ``--endpoint-reconciler-type=none`` (127.0.0.1 is not a valid endpoint for the ``kubernetes``
  Service), certificates of :mod:`harness.cluster.pki`.

:func:`stop` deletes the pods (the kubelet's SIGTERM and grace period), stops the processes in reverse order,
removes what runc and the shims left, unmounts what lies under the state folder, removes the pods' network
(:func:`harness.cluster.network.teardown`: network namespaces, the bridge, the kubelet's iptables chains), the cgroups
the kubelet made (``kubepods``) and then the state folder itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.cluster import K8S_VERSION, PAUSE_IMAGE, bin_dir, ctr_argv, images, kubeconfig, network, pki, state_dir
from harness.ports import free_port

#: The node's name and its ``Hostname`` address: the API server reaches the kubelet (logs, exec) by it
#: (``--kubelet-preferred-address-types=Hostname``), so at 127.0.0.1, where the kubelet listens. Its InternalIP,
#: which host-network pods get as their IP and the kubelet probes, is the host's default-route address: the kubelet
#: refuses a loopback node IP ("nodeIP can't be loopback address").
NODE_NAME = "localhost"
#: Components in start order; :func:`stop` goes the other way.
ORDER = ("containerd", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
CGROUP_ROOT = Path("/sys/fs/cgroup")
STOP_GRACE_S = 15.0


class ClusterError(RuntimeError):
    """A component did not start or become ready; the message names it and the tail of its log."""


def _log_tail(name: str, lines: int = 15) -> str:
    path = state_dir() / "logs" / f"{name}.log"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait(name: str, ready: Callable[[], bool], timeout_s: float) -> float:
    """Poll ``ready`` until true; seconds it took. Raises :class:`ClusterError` when the process died or time ran
    out (a start-up wait, so polling: the components give no event to wait on)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if not _alive(name):
            raise ClusterError(f"{name} exited during start-up:\n{_log_tail(name)}")
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if ready():
                return time.monotonic() - t0
        time.sleep(0.2)
    raise ClusterError(f"{name} not ready after {timeout_s:.0f} s:\n{_log_tail(name)}")


def _pid(name: str) -> int | None:
    try:
        return int((state_dir() / "pids" / name).read_text())
    except (OSError, ValueError):
        return None


#: The processes this Python process started (their exec may not have happened yet when first asked).
_children: dict[str, subprocess.Popen[bytes]] = {}


def _alive(name: str) -> bool:
    if name in _children:
        return _children[name].poll() is None
    pid = _pid(name)
    if pid is None:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # the pid is ours only while it still runs our binary (never signal a reused pid); a zombie is not alive
    return name.encode() in cmdline.split(b"\0")[0] and stat.rsplit(")", 1)[1].split()[0] != "Z"


def _spawn(name: str, argv: Sequence[str]) -> None:
    state = state_dir()
    (state / "logs").mkdir(parents=True, exist_ok=True)
    (state / "pids").mkdir(parents=True, exist_ok=True)
    with (state / "logs" / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=state,
        )
    _children[name] = proc
    (state / "pids" / name).write_text(str(proc.pid))


def kubectl(*args: str, check: bool = True, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """The cached kubectl against this cluster's kubeconfig; its output as text."""
    return subprocess.run(
        [str(bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig()}", *args],
        check=check,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def alive(name: str) -> bool:
    """True while the component ``name`` (one of :data:`ORDER`) runs."""
    return _alive(name)


def api_running() -> bool:
    """True while etcd and the API server run (enough for applying manifests)."""
    return _alive("etcd") and _alive("kube-apiserver")


def running() -> bool:
    """True when every component of a started cluster still runs."""
    return all(_alive(name) for name in ORDER)


def ports() -> dict[str, int]:
    return dict(json.loads((state_dir() / "ports.json").read_text()))


def _containerd_config(state: Path) -> str:
    c = state / "containerd"
    return f"""version = 2
root = "{c}/root"
state = "{c}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{c}/containerd.sock"
[ttrpc]
  address = "{c}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{c}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{state}/cni/bin"
    conf_dir = "{state}/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{bin_dir() / "runc"}"
        Root = "{c}/runc"
        SystemdCgroup = false
"""


def _kubeconfig_text(state: Path, port: int) -> str:
    p = state / "pki"
    return f"""apiVersion: v1
kind: Config
clusters:
- name: streaminfer
  cluster:
    server: https://127.0.0.1:{port}
    certificate-authority: {p}/ca.crt
users:
- name: admin
  user:
    client-certificate: {p}/admin.crt
    client-key: {p}/admin.key
contexts:
- name: streaminfer
  context: {{cluster: streaminfer, user: admin}}
current-context: streaminfer
"""


def _kubelet_config(state: Path, port: int, healthz: int) -> str:
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://{state}/containerd/containerd.sock
podLogsDir: {state}/pod-logs
resolvConf: /etc/resolv.conf
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {state}/pki/ca.crt}}
authorization: {{mode: AlwaysAllow}}
evictionHard: {{memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
"""


def start(*, log: Callable[[str], None] = print) -> dict[str, float]:
    """Start every component and wait until each is ready; seconds each took. Raises :class:`ClusterError`
    (the components started so far keep running: call :func:`stop`)."""
    state, b = state_dir(), bin_dir()
    if running():
        log(f"cluster: already running (kubeconfig {kubeconfig()})")
        return {}
    if any(_alive(name) for name in ORDER) or _our_processes(str(state)):
        raise ClusterError(f"a cluster is partly running in {state}: make cluster-stop first")
    shutil.rmtree(state, ignore_errors=True)  # a fresh start: no etcd data or ports of an earlier one
    for sub in ("containerd", "etcd", "kubelet", "pod-logs", "logs", "pids"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    pki.make(state / "pki")
    taken = {name: free_port() for name in ("etcd", "etcd-peer", "apiserver", "kubelet", "kubelet-healthz")}
    (state / "ports.json").write_text(json.dumps(taken))
    kubeconfig().write_text(_kubeconfig_text(state, taken["apiserver"]))
    (state / "containerd" / "config.toml").write_text(_containerd_config(state))
    try:  # the bridge, the CNI plugins and the configuration containerd's CRI loads
        network.setup(state, log)
    except (network.NetworkError, subprocess.CalledProcessError) as e:
        raise ClusterError(f"the pods' network: {e} {getattr(e, 'stderr', '') or ''}") from e
    (state / "kubelet.yaml").write_text(_kubelet_config(state, taken["kubelet"], taken["kubelet-healthz"]))
    # what existed before, so that stop removes only what this cluster made
    (state / "preexisting.json").write_text(
        json.dumps(
            {
                "run_containerd": Path("/run/containerd").exists(),
                "kubepods": [str(d) for d in CGROUP_ROOT.glob("*/kubepods")],
            }
        )
    )
    p = state / "pki"
    times: dict[str, float] = {}
    sock = state / "containerd" / "containerd.sock"

    _spawn("containerd", ["containerd", "--config", str(state / "containerd/config.toml")])
    times["containerd"] = _wait(
        "containerd",
        lambda: (
            sock.exists()
            and subprocess.run([*ctr_argv(), "version"], capture_output=True, check=False, timeout=10).returncode == 0
        ),
        60,
    )
    images.import_pause()

    etcd_url = f"http://127.0.0.1:{taken['etcd']}"
    peer_url = f"http://127.0.0.1:{taken['etcd-peer']}"
    _spawn(
        "etcd",
        [
            str(b / "etcd"),
            "--name",
            "default",
            "--data-dir",
            str(state / "etcd"),
            "--listen-client-urls",
            etcd_url,
            "--advertise-client-urls",
            etcd_url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            f"default={peer_url}",
            "--log-level",
            "warn",
        ],
    )
    times["etcd"] = _wait("etcd", lambda: _http_ok(f"{etcd_url}/health"), 60)

    _spawn(
        "kube-apiserver",
        [
            str(b / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={taken['apiserver']}",
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={p}/apiserver.crt",
            f"--tls-private-key-file={p}/apiserver.key",
            f"--client-ca-file={p}/ca.crt",
            f"--service-account-key-file={p}/sa.pub",
            f"--service-account-signing-key-file={p}/sa.key",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={pki.SERVICE_RANGE}",
            "--authorization-mode=Node,RBAC",
            f"--kubelet-client-certificate={p}/admin.crt",
            f"--kubelet-client-key={p}/admin.key",
            "--kubelet-preferred-address-types=Hostname",
            "--profiling=false",
            "--v=1",
        ],
    )
    times["kube-apiserver"] = _wait(
        "kube-apiserver", lambda: kubectl("get", "--raw", "/readyz", check=False, timeout_s=10).returncode == 0, 180
    )

    kc = str(kubeconfig())
    _spawn(
        "kube-controller-manager",
        [
            str(b / "kube-controller-manager"),
            f"--kubeconfig={kc}",
            "--leader-elect=false",
            "--secure-port=0",
            f"--service-account-private-key-file={p}/sa.key",
            f"--root-ca-file={p}/ca.crt",
            "--use-service-account-credentials=false",
            "--controllers=*,-nodeipam,-cloud-node-lifecycle",
            "--v=1",
        ],
    )
    _spawn(
        "kube-scheduler",
        [str(b / "kube-scheduler"), f"--kubeconfig={kc}", "--leader-elect=false", "--secure-port=0", "--v=1"],
    )
    _spawn(
        "kubelet",
        [
            str(b / "kubelet"),
            f"--config={state / 'kubelet.yaml'}",
            f"--kubeconfig={kc}",
            f"--root-dir={state / 'kubelet'}",
            f"--hostname-override={NODE_NAME}",
            "--v=1",
        ],
    )
    times["kube-controller-manager"] = _wait(
        "kube-controller-manager",
        lambda: kubectl("get", "serviceaccount", "default", "-n", "default", check=False, timeout_s=10).returncode == 0,
        120,
    )
    times["kubelet"] = _wait(
        "kubelet",
        lambda: (
            kubectl(
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                check=False,
                timeout_s=10,
            ).stdout
            == "True"
        ),
        180,
    )
    times["kube-scheduler"] = _wait("kube-scheduler", lambda: True, 5)
    log(
        f"cluster: Kubernetes {K8S_VERSION} on 127.0.0.1:{taken['apiserver']}, node {NODE_NAME} Ready; "
        f"export KUBECONFIG={kc}"
    )
    return times


def _http_ok(url: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - a loopback URL we made
        return bool(r.status == 200)


def _terminate(name: str, grace_s: float = STOP_GRACE_S) -> None:
    pid = _pid(name)
    if pid is None or not _alive(name):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _alive(name) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _our_processes(marker: str) -> list[int]:
    """Pids of processes whose command line names ``marker`` (the state folder): the shims and what runc left."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


def _mounts_under(root: Path) -> list[str]:
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == str(root) or point.startswith(f"{root}/"):
                points.append(point)
    return points


def _remove_cgroup_tree(top: Path) -> None:
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


def stop(*, log: Callable[[str], None] = print) -> None:
    """Stop everything :func:`start` started and remove what it wrote (the state folder, the ``kubepods`` cgroups,
    containerd's shim sockets folder where it made ``/run/containerd``). Safe to call twice or on a half start."""
    state = state_dir()
    if not state.exists():
        log("cluster: nothing to stop")
        return
    if _alive("kube-apiserver") and _alive("kubelet"):
        # the kubelet's own stop: SIGTERM, the grace period, then SIGKILL, as in a real cluster
        kubectl(
            "delete", "pods", "--all", "--all-namespaces", "--wait=true", "--timeout=60s", check=False, timeout_s=90
        )
    for name in reversed(ORDER):
        _terminate(name)
    runc_root = state / "containerd" / "runc" / "k8s.io"
    runc = bin_dir() / "runc"
    if runc_root.is_dir() and runc.exists():
        for container in runc_root.iterdir():
            subprocess.run(
                [str(runc), "--root", str(runc_root), "delete", "--force", container.name],
                capture_output=True,
                check=False,
                timeout=30,
            )
    for pid in _our_processes(str(state)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    for point in reversed(_mounts_under(state)):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    network.teardown(state, log=log)
    before: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        before = json.loads((state / "preexisting.json").read_text())
    kept = set(before.get("kubepods", []))
    for top in CGROUP_ROOT.glob("*/kubepods"):
        if str(top) not in kept:
            _remove_cgroup_tree(top)
    if before.get("run_containerd") is False:
        shutil.rmtree("/run/containerd", ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)
    log(f"cluster: stopped, {state} removed")
