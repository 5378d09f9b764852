"""The one-node cluster's pieces that need no cluster: the pause image archive, the certificates, the configs."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

from harness.cluster import images, node, pki


def test_the_pause_archive_is_an_oci_layout_whose_digests_match(tmp_path: Path) -> None:
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF not really")
    with tarfile.open(fileobj=io.BytesIO(images.pause_archive(binary, "example.local/pause:9"))) as t:
        files = {m.name: t.extractfile(m).read() for m in t.getmembers()}  # type: ignore[union-attr]
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "example.local/pause:9"
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["config"]["Entrypoint"] == ["/pause"]
    layer = files[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"]
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as t:
        member = t.getmember("pause")
        assert member.mode == 0o755
        assert t.extractfile(member).read() == binary.read_bytes()  # type: ignore[union-attr]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")
def test_the_certificates_chain_to_the_ca_with_the_names_the_components_use(tmp_path: Path) -> None:
    pki.make(tmp_path)
    for leaf in ("apiserver", "admin"):
        subprocess.run(
            ["openssl", "verify", "-CAfile", tmp_path / "ca.crt", tmp_path / f"{leaf}.crt"],
            check=True,
            capture_output=True,
        )
    text = subprocess.run(
        ["openssl", "x509", "-in", tmp_path / "apiserver.crt", "-noout", "-text"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "IP Address:127.0.0.1" in text
    assert f"IP Address:{pki.SERVICE_IP}" in text
    subject = subprocess.run(
        ["openssl", "x509", "-in", tmp_path / "admin.crt", "-noout", "-subject"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "O = system:masters" in subject  # the admin may do everything (a one-user test cluster)


def test_the_configs_keep_everything_under_the_state_folder_and_set_what_this_machine_needs(tmp_path: Path) -> None:
    containerd = tomllib.loads(node._containerd_config(tmp_path))
    cri = containerd["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == node.PAUSE_IMAGE
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    paths = [
        containerd["root"],
        containerd["state"],
        containerd["grpc"]["address"],
        runc["Root"],
        cri["cni"]["conf_dir"],
    ]
    assert all(p.startswith(f"{tmp_path}/") for p in paths), paths
    assert runc["BinaryName"].endswith("/runc")
    kubelet = yaml.safe_load(node._kubelet_config(tmp_path, 10250, 10248))
    assert (kubelet["cgroupDriver"], kubelet["failCgroupV1"]) == ("cgroupfs", False)
    assert kubelet["address"] == "127.0.0.1"
    assert kubelet["readOnlyPort"] == 0
    assert kubelet["podLogsDir"].startswith(str(tmp_path))
    assert kubelet["makeIPTablesUtilChains"] is False


def test_the_pod_network_stays_on_this_machine() -> None:
    """No default route, no NAT, no gateway role (which would turn on the host's ip_forward), a private subnet whose
    gateway is the address the tests' broker listens on."""
    import ipaddress

    from harness.cluster import network

    bridge, portmap = network.conflist()["plugins"]  # type: ignore[misc]
    assert (bridge["type"], bridge["bridge"]) == ("bridge", network.BRIDGE)
    assert len(network.BRIDGE) <= 15  # IFNAMSIZ - 1
    assert bridge["isGateway"] is False
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["routes"] == []
    ((subnet,),) = bridge["ipam"]["ranges"]
    net = ipaddress.ip_network(subnet["subnet"])
    assert net.is_private
    assert ipaddress.ip_address(subnet["gateway"]) in net
    assert subnet["gateway"] == network.GATEWAY
    assert portmap["type"] == "portmap"
    assert {"bridge", "host-local", "loopback", "portmap"} <= set(network.PLUGINS)


@pytest.mark.parametrize(
    ("routes", "overlaps"),
    [
        ("default via 192.0.2.1 dev eth0\n192.0.2.0/24 dev eth0 proto kernel scope link src 192.0.2.2\n", False),
        ("local 127.0.0.0/8 dev lo table local proto kernel scope host src 127.0.0.1\n", False),
        ("10.0.0.0/8 via 192.0.2.1 dev eth0\n", True),
        ("local 10.213.0.1 dev streaminfer0 table local proto kernel scope host src 10.213.0.1\n", True),
        ("unreachable 10.213.0.0/16\n", True),
        ("blackhole 10.214.0.0/16\n", False),
    ],
)
def test_a_route_overlapping_the_pods_subnet_is_found(
    routes: str, overlaps: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.cluster import network

    monkeypatch.setattr(
        network, "_ip", lambda *args, check=True: subprocess.CompletedProcess(list(args), 0, stdout=routes)
    )
    assert (network._overlapping_route() is not None) is overlaps
