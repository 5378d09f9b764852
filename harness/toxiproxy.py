"""Shopify's toxiproxy (a TCP proxy that injects latency, jitter, bandwidth limits and connection resets) for the
fault harness: where this kernel has no ``netem`` and no iptables (:mod:`harness.netns`), the link faults
it cannot make are made one level up, in the byte stream.

The server is built once from its Go module (``go install``, the pinned :data:`VERSION`, through the Go module
proxy the machine is allowed to reach) into ``$STREAMINFER_CACHE`` (default ``~/.cache/streaminfer``)
``/toxiproxy/<version>/``; nothing is committed. :class:`Toxiproxy` runs it on a free port and drives its REST API
(``POST /proxies``, ``POST /proxies/<name>/toxics``, ``DELETE /proxies/<name>/toxics/<toxic>``, as documented in
toxiproxy's README).

What it cannot do: drop or reorder packets (TCP hides loss from a stream proxy; only ``netem`` could).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from harness.ports import free_port

#: The toxiproxy release built, and its server's Go package.
VERSION = "v2.12.0"
PACKAGE = "github.com/Shopify/toxiproxy/v2/cmd/server"
#: Longest wait for ``go install`` (first use: the module and its dependencies are downloaded, under a minute
#: here), s; it runs inside the fault test's time limit, so a module proxy that does not answer must not eat it.
BUILD_TIMEOUT_S = 180.0


class ToxiproxyUnavailable(RuntimeError):
    """The server cannot be built or started here; the message says why (the scenarios are skipped with it)."""


def cache_dir() -> Path:
    """Where the built server is kept."""
    root = os.environ.get("STREAMINFER_CACHE") or str(Path.home() / ".cache" / "streaminfer")
    return Path(root) / "toxiproxy" / VERSION


def binary() -> Path:
    """The toxiproxy server, built on first use.

    Raises:
        ToxiproxyUnavailable: no ``go`` on PATH, or the build failed (its last output lines in the message).
    """
    out = cache_dir()
    server = out / "server"
    if server.is_file():
        return server
    go = shutil.which("go")
    if go is None:
        raise ToxiproxyUnavailable("no Go toolchain on PATH to build toxiproxy")
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOBIN": str(out), "GOFLAGS": "-mod=mod"}
    try:
        done = subprocess.run(  # noqa: S603 (the go command, with our own arguments)
            [go, "install", f"{PACKAGE}@{VERSION}"], env=env, capture_output=True, text=True,
            timeout=BUILD_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ToxiproxyUnavailable(f"go install {PACKAGE}@{VERSION} took over {BUILD_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0 or not server.is_file():
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise ToxiproxyUnavailable(f"go install {PACKAGE}@{VERSION} failed: {tail}")
    return server


class Toxiproxy:
    """A running toxiproxy server (a context manager; :meth:`close` stops it).

    Args:
        log: where its output goes.

    Raises:
        ToxiproxyUnavailable: it cannot be built or did not answer within 10 s.
    """

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.api = f"http://127.0.0.1:{self.port}"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self._proc = subprocess.Popen(  # noqa: S603 (our own build, our own arguments)
                [str(binary()), "-host", "127.0.0.1", "-port", str(self.port)], stdout=out, stderr=out
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self._call("GET", "/version")
                return
            except OSError:
                if self._proc.poll() is not None:
                    break
                time.sleep(0.1)
        self.close()
        raise ToxiproxyUnavailable(f"toxiproxy did not answer on {self.api} (log: {log})")

    def __enter__(self) -> Toxiproxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.api + path, data=data, method=method)  # noqa: S310 (our own server)
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            text = response.read()
        return json.loads(text) if text else None

    def proxy(self, name: str, listen: str, upstream: str) -> None:
        """Listen on ``listen`` (``host:port``) and forward to ``upstream``."""
        self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream, "enabled": True})

    def add(self, proxy: str, toxic: str, kind: str, stream: str, **attributes: int) -> None:
        """Add toxic ``toxic`` of ``kind`` (``latency``, ``bandwidth``, ``reset_peer``, ``timeout``, ...) on
        ``stream`` (``upstream``: client -> server, ``downstream``: server -> client) of ``proxy``, with its
        attributes (``latency``/``jitter`` ms, ``rate`` KB/s, ``timeout`` ms)."""
        body = {"name": toxic, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attributes}
        self._call("POST", f"/proxies/{proxy}/toxics", body)

    def remove(self, proxy: str, toxic: str) -> None:
        """Remove a toxic (one that is not there: nothing)."""
        try:
            self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic}")
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise

    def close(self) -> None:
        """Stop the server (its proxies close their connections)."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
