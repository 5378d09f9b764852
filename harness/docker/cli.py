"""``python -m harness.docker``: the container steps' command line (``make docker-engine``, ``make image-*``).

Verbs (exit 0 unless said otherwise; 1 a failure, named in one line; 2 a bad flag; 3 no engine here)::

    engine start [--storage-driver overlay2|vfs] [--network bridge|host] [--data-root DIR] [--env]
                    use the engine that answers, or install (Debian's docker.io) and start dockerd here on a socket of
                    its own (harness/docker/engine.py); --env prints `export DOCKER_HOST=...` and
                    `export DOCKER_STARTED_HERE=1|0` for `eval` (1: this call started it). Exit 3 when this
                    machine cannot run an engine (not root, not Debian)
    engine stop     stop the engine started here, its containers and every process of it; one not started here is
                    left alone
    engine status   "running" (0) with its address, driver and network, or "not running" (3)
    base [python|jre] [--rebuild]
                    the Debian base image made with debootstrap (built once; prints its tag)
    build cpu|gpu [--tag T] [--base IMAGE] [--ca-bundle FILE] [--no-cache]
                    build docker/<flavour>.Dockerfile (harness/docker/images.py); prints its size
    kafka-image [--base IMAGE] [--tag T]
                    build apache/kafka:<the local broker's version> from the local broker's jars
    serve [--image T] [--state DIR]
                    the CPU image end to end as the Deployment runs it (harness/docker/serve.py)

The verbs after ``engine`` use the engine ``engine start`` would find (``DOCKER_HOST``, the default socket, or the one
started here) and exit 3 naming ``make docker-engine`` when none answers. Environment: ``DOCKER_HOST``,
``PIP_CERT`` (the CA bundle for pip inside builds), ``IMAGE_SOURCE`` (the source label), ``STREAMINFER_CACHE``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.docker import engine as engines
from harness.docker.client import DockerError
from harness.docker.engine import EngineError, EngineUnavailable
from harness.localkafka.java import BrokerSetupError

ROOT = Path(__file__).resolve().parents[2]
EXIT_FAILED, EXIT_NO_ENGINE = 1, 3


def say(line: str) -> None:
    """A progress line (stderr)."""
    print(f"docker: {line}", file=sys.stderr, flush=True)


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m harness.docker",
        description="The Docker engine, the images and the container end-to-end run of streaminfer's CI.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--state", type=Path, default=engines.DEFAULT_STATE, help="the engine's state folder")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    engine = verbs.add_parser("engine", help="start, stop or query the engine")
    ev = engine.add_subparsers(dest="engine_verb", required=True, metavar="start|stop|status")
    start = ev.add_parser("start", help="use or start an engine")
    start.add_argument("--storage-driver", choices=("overlay2", "vfs"), help="only this storage driver")
    start.add_argument("--network", choices=("bridge", "host"), help="only this network mode")
    start.add_argument("--data-root", type=Path, help="dockerd's --data-root (default /var/lib/docker)")
    start.add_argument("--env", action="store_true", help="print export lines for eval")
    ev.add_parser("stop", help="stop the engine started here")
    ev.add_parser("status", help="running or not running")
    base = verbs.add_parser("base", help="the local Debian base image")
    base.add_argument("recipe", nargs="?", default="python", choices=("python", "jre"))
    base.add_argument("--rebuild", action="store_true", help="build it again (later Debian updates)")
    build = verbs.add_parser("build", help="build a streaminfer image")
    build.add_argument("flavour", choices=("cpu", "gpu"))
    build.add_argument("--tag", help="image name (default streaminfer:<version>-<flavour>)")
    build.add_argument("--base", help="BASE_IMAGE (default: the Dockerfile's, else the local Debian base)")
    build.add_argument("--ca-bundle", type=Path, help="CA bundle for pip inside the build (default $PIP_CERT)")
    build.add_argument("--no-cache", action="store_true", help="build every layer again")
    kafka = verbs.add_parser("kafka-image", help="build apache/kafka:<version> from the local broker's jars")
    kafka.add_argument("--base", help="a base with java >= 17 (default: the local Debian JRE base)")
    kafka.add_argument("--tag", help="image name (default apache/kafka:<the local broker's version>)")
    serve = verbs.add_parser("serve", help="the CPU image end to end, as the Deployment runs it")
    serve.add_argument("--image", help="the image (default: the cpu overlay's image name)")
    serve.add_argument("--state", dest="serve_state", type=Path, default=ROOT / ".docker-e2e", help="work folder")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (see the module docstring)."""
    args = parser().parse_args(argv)
    try:
        return _dispatch(args)
    except EngineUnavailable as exc:
        say(f"no engine: {exc}")
        return EXIT_NO_ENGINE
    except (EngineError, DockerError, BrokerSetupError, ValueError, OSError) as exc:
        say(f"error: {exc}")
        return EXIT_FAILED
    except RuntimeError as exc:  # ServeError, ManifestError
        say(f"error: {exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        say("interrupted")
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    state: Path = args.state
    if args.verb == "engine":
        return _engine(args, state)
    found = engines.find(state)
    if found is None:
        raise EngineUnavailable("no Docker engine answers: `make docker-engine` starts one (or set DOCKER_HOST)")
    docker = found.docker()
    if args.verb == "base":
        from harness.docker import base

        print(base.ensure(docker, base.RECIPES[args.recipe], rebuild=args.rebuild, say=say))
        return 0
    if args.verb == "build":
        from harness.docker import images

        tag = args.tag or f"streaminfer:{images.project_version()}-{args.flavour}"
        built = images.build(
            docker, args.flavour, tag=tag, base=args.base, ca=images.ca_bundle(args.ca_bundle), no_cache=args.no_cache,
            say=say,
        )  # fmt: skip
        extra = f" ldd_unresolved={','.join(built.unresolved) or 'none'}" if args.flavour == "gpu" else ""
        print(f"image: {built.tag} size_mb={built.size / 1e6:.0f} base={built.base} build_s={built.seconds:.0f}{extra}")
        return 0
    if args.verb == "kafka-image":
        from harness.docker import base, kafka

        base_image = args.base or base.ensure(docker, base.RECIPES["jre"], say=say)
        cache = Path(os.environ.get("STREAMINFER_CACHE") or Path.home() / ".cache" / "streaminfer") / "kafka-jars"
        tag = kafka.build_image(docker, base_image, cache, tag=args.tag, say=say)
        size = int((docker.image(tag) or {}).get("Size", 0))
        print(f"image: {tag} size_mb={size / 1e6:.0f} base={base_image}")
        return 0
    from harness.docker import serve

    summary = serve.serve(found, args.serve_state, image=args.image, say=say)
    print(summary.line())
    return 0


def _engine(args: argparse.Namespace, state: Path) -> int:
    if args.engine_verb == "start":
        found = engines.start(
            state, storage_driver=args.storage_driver, network=args.network, data_root=args.data_root, say=say
        )
        if not found.started_now:
            whose = "started here earlier" if found.started_here else "not started here: it is never stopped here"
            say(f"using the engine at {found.host} ({found.version}, {found.storage_driver}, network {found.network}); "
                f"{whose}")  # fmt: skip
        if args.env:
            print(f"export DOCKER_HOST={shlex.quote(found.host)}")
            print(f"export DOCKER_STARTED_HERE={1 if found.started_now else 0}")
        else:
            print(found.host)
            if found.host != f"unix://{engines.DEFAULT_SOCKET}":
                say(f"for docker and the tests: export DOCKER_HOST={found.host}")
        return 0
    if args.engine_verb == "stop":
        if not engines.stop(state, say=say):
            say("no engine started here is running")
        return 0
    answering = engines.find(state)
    if answering is None:
        print("not running")
        return EXIT_NO_ENGINE
    print("running")
    whose = f" started-here pid={answering.pid}" if answering.started_here else ""
    print(f"{answering.host} {answering.version} {answering.storage_driver} network={answering.network} "
          f"gateway={answering.gateway}{whose}")  # fmt: skip
    return 0
