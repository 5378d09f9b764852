"""The pods' network of the one-node cluster: each pod in its own network namespace on a local bridge, through
containerd's CRI and the CNI plugins of Debian's ``containernetworking-plugins`` (``bridge``, ``host-local``,
``loopback``, ``portmap``).

The choices, and why (issue 35):

- **A bridge made by the harness, not by the plugin**: :func:`setup` makes :data:`BRIDGE` with the gateway address
  :data:`GATEWAY` of :data:`SUBNET` before any pod exists, so the tests' broker can listen there before the first
  pod starts. The ``bridge`` plugin finds it and only attaches each pod's veth (``isGateway: false``, so it neither
  assigns the address nor turns on the host's ``net.ipv4.ip_forward``; ``ipMasq: false``, so no NAT rule).
- **Traffic stays on this machine**: :data:`SUBNET` is private and routed nowhere; the pods get no default route
  (``host-local`` hands out no ``routes``), only the subnet's own, so from a pod the gateway and the other pods are
  all there is; the host does not forward (``ip_forward`` is left as it was: 0 here).
- **How pods reach the broker**: the broker (loopback-only elsewhere in the tests) listens and advertises at
  :data:`GATEWAY` for the cluster tests (``LocalBroker(hosts=[GATEWAY])``). The host's clients (the producer and the
  result reader of the tests) use the same address: it is a local address of the host, so their traffic never
  leaves it either. Keeping ``hostNetwork`` for the consumer pods would bring back the one shared HTTP port that
  stops two replicas (a scale to 2, a rollout's surge pod) from running on one node.
- **Where things live**: the plugins (installed with apt-get where missing: :func:`ensure_plugins`) are linked
  into ``<state>/cni/bin`` and the configuration is ``<state>/cni/net.d`` (containerd's CRI ``bin_dir`` and
  ``conf_dir``), the address leases in ``<state>/cni/ipam`` (``host-local``'s ``dataDir``). Outside the state
  folder there remain only what the kernel and containerd keep elsewhere: the bridge, the pods' network namespaces
  (``/run/netns/cni-*``, made by containerd) with their veths, and any iptables chain of the kubelet's (``KUBE-*``;
  none with ``makeIPTablesUtilChains: false``). :func:`teardown` removes each of them that was not there before
  :func:`setup` (recorded in ``<state>/network.json``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

#: The bridge's name (15 characters at most).
BRIDGE = "streaminfer0"
#: The pods' subnet: private (RFC 1918), routed nowhere, checked at start not to overlap a route of this host.
SUBNET = "10.213.0.0/24"
#: The bridge's (the host's) address on it: the kubelet's probes come from it, the tests' broker listens on it.
GATEWAY = "10.213.0.1"
#: The plugins, from Debian's containernetworking-plugins (``apt-get install containernetworking-plugins``).
PLUGIN_DIR = Path("/usr/lib/cni")
PLUGINS = ("bridge", "host-local", "loopback", "portmap")
NETNS_DIR = Path("/run/netns")
#: The iptables chains the kubelet makes (its canaries, the hint chain and its localnet firewall).
KUBELET_CHAINS = ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY", "KUBE-FIREWALL")
IPTABLES = ("iptables", "ip6tables")
#: The route types ``ip route`` writes before a route's destination (ip-route(8)).
ROUTE_TYPES = {"unicast", "local", "broadcast", "multicast", "throw", "unreachable", "prohibit", "blackhole", "nat"}


class NetworkError(RuntimeError):
    """The pods' network cannot be made here: the message says what is missing or in the way."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def bridge_exists() -> bool:
    return _ip("link", "show", BRIDGE, check=False).returncode == 0


def conflist() -> dict[str, object]:
    """The CNI configuration containerd loads (``<state>/cni/net.d/10-streaminfer.conflist``); ``dataDir`` is
    filled in by :func:`setup`."""
    return {
        "cniVersion": "1.0.0",
        "name": "streaminfer",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": SUBNET, "gateway": GATEWAY}]],
                    "routes": [],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False},
        ],
    }


def _chains() -> dict[str, list[str]]:
    """``{"iptables:filter": [chain, ...], ...}``: the chains of :data:`KUBELET_CHAINS` each table has now."""
    found: dict[str, list[str]] = {}
    for tool in IPTABLES:
        try:
            out = subprocess.run([f"{tool}-save"], capture_output=True, text=True, check=False, timeout=30).stdout
        except FileNotFoundError:
            continue
        table = ""
        for line in out.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and line[1:].split()[0] in KUBELET_CHAINS:
                found.setdefault(f"{tool}:{table}", []).append(line[1:].split()[0])
    return found


def _overlapping_route() -> str | None:
    net = ipaddress.ip_network(SUBNET)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        dest = words[1] if words[:1] and words[0] in ROUTE_TYPES and len(words) > 1 else (words or [""])[0]
        with contextlib.suppress(ValueError):  # "default"
            if ipaddress.ip_network(dest, strict=False).overlaps(net):
                return line
    return None


def ensure_plugins(log: Callable[[str], None] = print) -> None:
    """Install Debian's ``containernetworking-plugins`` where a plugin of :data:`PLUGINS` is missing (root on
    Debian, as ``make docker-engine`` installs ``docker.io``). Raises :class:`NetworkError` where that fails."""
    from harness.docker.engine import EngineError, EngineUnavailable, apt_install

    missing = [p for p in PLUGINS if not (PLUGIN_DIR / p).is_file()]
    if not missing:
        return
    try:
        apt_install("containernetworking-plugins", str(PLUGIN_DIR / missing[0]), log)
    except (EngineError, EngineUnavailable) as e:
        raise NetworkError(f"CNI plugins {missing} not in {PLUGIN_DIR}: {e}") from e
    still = [p for p in PLUGINS if not (PLUGIN_DIR / p).is_file()]
    if still:
        raise NetworkError(f"containernetworking-plugins installed, but {still} are not in {PLUGIN_DIR}")


def setup(state: Path, log: Callable[[str], None] = print) -> None:
    """Make the bridge and the CNI folders of the cluster in ``state``; record what existed before. Raises
    :class:`NetworkError` when a plugin is missing (and cannot be installed), the bridge already exists or
    :data:`SUBNET` overlaps a route."""
    ensure_plugins(log)
    if bridge_exists():
        raise NetworkError(f"the interface {BRIDGE} already exists (another cluster, or make cluster-stop first)")
    overlap = _overlapping_route()
    if overlap:
        raise NetworkError(f"the pods' subnet {SUBNET} overlaps this host's route {overlap!r}")
    cni = state / "cni"
    for sub in ("bin", "net.d", "ipam"):
        (cni / sub).mkdir(parents=True, exist_ok=True)
    for plugin in PLUGINS:
        (cni / "bin" / plugin).symlink_to(PLUGIN_DIR / plugin)
    config = conflist()
    plugins = config["plugins"]
    assert isinstance(plugins, list)
    plugins[0]["ipam"]["dataDir"] = str(cni / "ipam")
    (cni / "net.d" / "10-streaminfer.conflist").write_text(json.dumps(config, indent=1))
    record = {
        "netns": sorted(p.name for p in NETNS_DIR.glob("*")) if NETNS_DIR.is_dir() else [],
        "chains": _chains(),
        "bridge": True,
    }
    (state / "network.json").write_text(json.dumps(record))
    _ip("link", "add", "name", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{GATEWAY}/{SUBNET.split('/')[1]}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def _remove_netns(name: str) -> None:
    path = NETNS_DIR / name
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
    with contextlib.suppress(OSError):
        path.unlink()


def _remove_chains(kept: dict[str, list[str]]) -> list[str]:
    """Delete the kubelet's chains that were not there at start (the jumps to them first); what was deleted."""
    removed = []
    for where, chains in _chains().items():
        tool, table = where.split(":")
        for chain in chains:
            if chain in kept.get(where, []):
                continue
            out = subprocess.run(
                [tool, "-t", table, "-S"], capture_output=True, text=True, check=False, timeout=30
            ).stdout
            for rule in out.splitlines():
                words = rule.split()
                if words[:1] == ["-A"] and "-j" in words and words[words.index("-j") + 1] == chain:
                    subprocess.run([tool, "-t", table, "-D", *words[1:]], capture_output=True, check=False)
            subprocess.run([tool, "-t", table, "-F", chain], capture_output=True, check=False)
            subprocess.run([tool, "-t", table, "-X", chain], capture_output=True, check=False)
            removed.append(f"{where}/{chain}")
    return removed


def teardown(state: Path, *, log: Callable[[str], None] = print) -> None:
    """Remove what :func:`setup` and the pods made outside ``state``: the pods' network namespaces containerd left
    (and with them their veths), the bridge, the kubelet's iptables chains. Safe without a record (nothing made)."""
    try:
        record = json.loads((state / "network.json").read_text())
    except (OSError, ValueError):
        return
    before = set(record.get("netns", []))
    if NETNS_DIR.is_dir():
        for ns in NETNS_DIR.glob("cni-*"):
            if ns.name not in before:
                _remove_netns(ns.name)
    if record.get("bridge") and bridge_exists():
        _ip("link", "delete", BRIDGE, check=False)
    removed = _remove_chains(record.get("chains", {}))
    if removed:
        log(f"cluster: removed the kubelet's iptables chains {', '.join(removed)}")
