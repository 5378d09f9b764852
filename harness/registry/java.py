"""What the local Schema Registry needs besides Python: a JDK >= 21 and the Apicurio Registry application.

**The JDK.** Apicurio Registry 3.x is a Quarkus application compiled for Java 21 (Java 17, the local broker's JDK,
refuses its classes), so the registry looks for its own JDK, in this order, and takes the first that is >= 21:

1. ``KAFKA_LOCAL_REGISTRY_JAVA_HOME`` (when set it must be one: no silent fall-back to another JDK);
2. ``JAVA_HOME``;
3. the JDKs installed in the usual places (:data:`JDK_ROOTS`: ``/usr/lib/jvm/*``, ``/usr/java/*``, ``/opt/java/*``,
   ``/opt/jdk*``, SDKMAN's and macOS's folders), newest first;
4. ``java`` on ``PATH``.

**The application.** Maven Central serves the runnable application (a Quarkus "fast-jar") as
``io.apicurio:apicurio-registry-app:<version>:tar.gz:all`` (about 160 MB). Maven resolves it into the local Maven
cache (``~/.m2``) through ``pom.xml`` next to this module with ``--strict-checksums`` (Maven's checksum policy
``fail``: the ``.sha1`` Central serves beside it must match what arrived); then :func:`app_home` checks the file's
SHA-1 against that ``.sha1`` once more and its SHA-256 against the one pinned here (:data:`APP_SHA256`), and
unpacks it once into a cache folder shared by every state folder (:func:`default_cache`), where later starts find
it (``.unpacked``, written last, names the archive's SHA-256).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.localkafka.java import BrokerSetupError, java_major

POM = Path(__file__).resolve().parent / "pom.xml"
#: The maven-dependency-plugin that names the resolved archive (pinned, as the broker's is).
MVN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
#: The Apicurio Registry release (handed to ``pom.xml`` as ``-Dapicurio.version``) and its archive's SHA-256 (the
#: ``.sha256`` Maven Central serves beside it); change both together.
APP_VERSION = "3.3.3"
APP_SHA256 = "8bc6751c76d963734224b01d5e7f84ccb3cb61c87d3bd77c36c35f10a5cbed63"
#: Apicurio Registry 3.x needs Java 21 or newer.
MIN_JAVA = 21
#: Where JDKs are installed (globs; ``~`` expanded), searched after KAFKA_LOCAL_REGISTRY_JAVA_HOME and JAVA_HOME.
JDK_ROOTS = (
    "/usr/lib/jvm/*",
    "/usr/java/*",
    "/opt/java/*",
    "/opt/jdk*",
    "~/.sdkman/candidates/java/*",
    "/Library/Java/JavaVirtualMachines/*/Contents/Home",
)
#: The setting that names the registry's JDK.
JAVA_HOME_SETTING = "KAFKA_LOCAL_REGISTRY_JAVA_HOME"
#: The setting that names the cache folder of the unpacked application.
CACHE_SETTING = "KAFKA_LOCAL_REGISTRY_CACHE"
#: Seconds Maven may take to resolve the archive (a cold download of 160 MB on a slow link included).
MVN_TIMEOUT_S = 900.0


class RegistrySetupError(BrokerSetupError):
    """Something the local registry needs is missing or broken (JDK, Maven, the application, a port, its state);
    the message says what and how to fix it. A :class:`BrokerSetupError`, so code that handles the local broker's
    setup failures handles the registry's too."""


# ------------------------------------------------------------------------------------------------------ the JDK
@dataclass(frozen=True, slots=True)
class Jdk:
    """A JDK found by :func:`find_registry_java`: its ``java`` and its major version."""

    java: Path
    major: int


def release_major(home: Path) -> int | None:
    """The major version in ``<home>/release`` (``JAVA_VERSION="25.0.3"`` -> 25), None without a readable one."""
    try:
        text = (home / "release").read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="([^"]+)"', text, re.MULTILINE)
    if not found:
        return None
    with contextlib.suppress(BrokerSetupError):
        return java_major(f'version "{found.group(1)}"')
    return None


def run_major(java: Path) -> int:
    """The major version ``java -version`` reports.

    Raises:
        RegistrySetupError: it does not run, or names no version.
    """
    try:
        done = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=60, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RegistrySetupError(f"'{java} -version' failed: {exc}") from exc
    lines = (done.stderr or done.stdout).splitlines()
    try:
        return java_major(lines[0] if lines else "")
    except BrokerSetupError as exc:
        raise RegistrySetupError(str(exc)) from None


def _home_major(home: Path) -> int | None:
    """A JDK home's major version: its ``release`` file, else what its ``java -version`` says; None when
    ``<home>/bin/java`` is not an executable or does not run."""
    java = home / "bin" / "java"
    if not (java.is_file() and os.access(java, os.X_OK)):
        return None
    major = release_major(home)
    if major is not None:
        return major
    try:
        return run_major(java)
    except RegistrySetupError:
        return None


def find_registry_java(env: Mapping[str, str] | None = None, roots: Sequence[str] = JDK_ROOTS) -> Jdk:
    """The ``java`` of a JDK >= :data:`MIN_JAVA` for the registry, searched as the module docstring says; the one
    chosen is run once (``java -version``) to check it works.

    Args:
        env: the environment (default ``os.environ``): KAFKA_LOCAL_REGISTRY_JAVA_HOME, JAVA_HOME, PATH.
        roots: the globs of JDK homes searched in step 3.

    Raises:
        RegistrySetupError: KAFKA_LOCAL_REGISTRY_JAVA_HOME is set but is no JDK >= 21, or none was found (the one
            line names everything searched and what each place held).
    """
    env = os.environ if env is None else env
    chosen = env.get(JAVA_HOME_SETTING)
    if chosen:
        major = _home_major(Path(chosen))
        if major is None:
            raise RegistrySetupError(f"{JAVA_HOME_SETTING} is set to {chosen!r} but {chosen}/bin/java does not run")
        if major < MIN_JAVA:
            raise RegistrySetupError(
                f"{JAVA_HOME_SETTING} is set to {chosen!r}, a Java {major}: the schema registry (Apicurio Registry "
                f"{APP_VERSION}) needs Java >= {MIN_JAVA}"
            )
        return _checked(Path(chosen) / "bin" / "java")
    seen: list[str] = [f"{JAVA_HOME_SETTING} (unset)"]
    java_home = env.get("JAVA_HOME")
    if java_home:
        major = _home_major(Path(java_home))
        if major is not None and major >= MIN_JAVA:
            return _checked(Path(java_home) / "bin" / "java")
        seen.append(f"JAVA_HOME={java_home} ({_described(major)})")
    else:
        seen.append("JAVA_HOME (unset)")
    found: list[tuple[int, Path]] = []
    held: list[str] = []
    homes = {Path(p).resolve(): None for pattern in roots for p in sorted(glob.glob(os.path.expanduser(pattern)))}
    for home in homes:  # in the order found, each JDK once (distributions link several names to one folder)
        major = _home_major(home)
        if major is not None and major >= MIN_JAVA:
            found.append((major, home))
        elif major is not None:
            held.append(f"{home}: Java {major}")
    if found:
        newest = max(found, key=lambda item: item[0])[1]  # the first listed of the newest version
        return _checked(newest / "bin" / "java")
    seen.append(f"{', '.join(roots)} ({'; '.join(held) if held else 'no JDK'})")
    on_path = shutil.which("java", path=env.get("PATH"))
    if on_path:
        major = _home_major(Path(on_path).resolve().parent.parent)
        if major is not None and major >= MIN_JAVA:
            return _checked(Path(on_path))
        seen.append(f"java on PATH ({on_path}: {_described(major)})")
    else:
        seen.append("java on PATH (none)")
    raise RegistrySetupError(
        f"no JDK >= {MIN_JAVA} for the schema registry (Apicurio Registry {APP_VERSION}); searched "
        + ", ".join(seen)
        + f": install one (e.g. a Temurin 21 or 25 JDK) or set {JAVA_HOME_SETTING} to its folder"
    )


def _described(major: int | None) -> str:
    return "no runnable java" if major is None else f"Java {major}"


def _checked(java: Path) -> Jdk:
    """``java`` run once: it must work and be >= :data:`MIN_JAVA` (a ``release`` file can lie).

    Raises:
        RegistrySetupError: it does not run or is older.
    """
    major = run_major(java)
    if major < MIN_JAVA:
        raise RegistrySetupError(f"{java} reports Java {major}; the schema registry needs Java >= {MIN_JAVA}")
    return Jdk(java, major)


# ---------------------------------------------------------------------------------------------- the application
def default_cache(env: Mapping[str, str] | None = None) -> Path:
    """The cache folder of unpacked applications: KAFKA_LOCAL_REGISTRY_CACHE, else ``$XDG_CACHE_HOME/streaminfer``,
    else ``~/.cache/streaminfer``."""
    env = os.environ if env is None else env
    if env.get(CACHE_SETTING):
        return Path(env[CACHE_SETTING])
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "streaminfer"


def resolve_archive(mvn_args: Sequence[str] = (), pom: Path = POM, scratch: Path | None = None) -> Path:
    """The application's ``tar.gz`` in the local Maven cache, downloaded by Maven (``--strict-checksums``) when it
    is not there yet.

    Args:
        mvn_args: extra Maven arguments (``-o`` for offline, ``-Dmaven.repo.local=DIR``).
        scratch: a folder for Maven's one-line output file (default: the cache folder).

    Raises:
        RegistrySetupError: mvn is missing, or it could not resolve the archive (its last lines in the message).
    """
    mvn = shutil.which("mvn")
    if not mvn:
        raise RegistrySetupError(
            "mvn (Apache Maven) not found: it fetches Apicurio Registry from Maven Central (e.g. apt-get install maven)"
        )
    folder = scratch or default_cache()
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"apicurio-path.txt.tmp.{os.getpid()}"
    argv = [mvn, "-q", "-B", "--strict-checksums", "-Dstyle.color=never", *mvn_args, "-f", str(pom),
            f"{MVN_DEPENDENCY_PLUGIN}:build-classpath", f"-Dapicurio.version={APP_VERSION}",
            f"-Dmdep.outputFile={out}"]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=MVN_TIMEOUT_S, check=False)  # noqa: S603
        resolved = out.read_text().strip() if out.exists() else ""
    except subprocess.TimeoutExpired:
        raise RegistrySetupError(f"mvn did not resolve Apicurio Registry within {MVN_TIMEOUT_S:.0f} s") from None
    finally:
        out.unlink(missing_ok=True)
    if done.returncode != 0 or not resolved:
        tail = "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr).splitlines()[-40:])
        raise RegistrySetupError(
            f"mvn could not resolve io.apicurio:apicurio-registry-app:{APP_VERSION}:tar.gz:all "
            f"(exit {done.returncode}):\n{tail}"
        )
    archive = Path(resolved.split(os.pathsep)[0])
    if not archive.is_file():
        raise RegistrySetupError(f"mvn named {archive}, which is not a file")
    return archive


def verify_archive(archive: Path, sha256: str = APP_SHA256) -> None:
    """Check ``archive`` against the pinned SHA-256 and, when Maven kept it, the ``.sha1`` Central served.

    Raises:
        RegistrySetupError: a digest differs (the file is deleted, so the next start downloads it again).
    """
    sha1, sha2 = hashlib.sha1(usedforsecurity=False), hashlib.sha256()
    with archive.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha1.update(block)
            sha2.update(block)
    served = archive.with_name(archive.name + ".sha1")
    expected_sha1 = served.read_text().split()[0].lower() if served.is_file() and served.read_text().split() else None
    problems = []
    if sha2.hexdigest() != sha256:
        problems.append(f"SHA-256 {sha2.hexdigest()}, pinned {sha256}")
    if expected_sha1 is not None and sha1.hexdigest() != expected_sha1:
        problems.append(f"SHA-1 {sha1.hexdigest()}, Maven Central's .sha1 says {expected_sha1}")
    if problems:
        archive.unlink(missing_ok=True)
        raise RegistrySetupError(f"{archive} is not the expected archive ({'; '.join(problems)}): deleted it")


def unpack(archive: Path, into: Path, sha256: str = APP_SHA256) -> Path:
    """Unpack ``archive`` into the folder ``into`` once; later calls find ``into/.unpacked`` and return at once.
    Two processes unpacking at the same time take turns (a lock file beside ``into``).

    Returns:
        ``into``, holding ``quarkus-run.jar``.

    Raises:
        RegistrySetupError: the archive has no ``quarkus-run.jar`` or cannot be unpacked.
    """
    marker = into / ".unpacked"
    if _unpacked(into, marker, sha256):
        return into
    into.parent.mkdir(parents=True, exist_ok=True)
    with _flocked(into.parent / f".{into.name}.lock"):
        if _unpacked(into, marker, sha256):
            return into
        tmp = into.parent / f".{into.name}.tmp.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")  # no absolute paths, links out of the folder or devices
        except (OSError, tarfile.TarError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RegistrySetupError(f"cannot unpack {archive}: {exc}") from exc
        if not (tmp / "quarkus-run.jar").is_file():
            shutil.rmtree(tmp, ignore_errors=True)
            raise RegistrySetupError(f"{archive} holds no quarkus-run.jar: not a Quarkus fast-jar application")
        (tmp / ".unpacked").write_text(sha256 + "\n")
        shutil.rmtree(into, ignore_errors=True)
        tmp.rename(into)
    return into


def _unpacked(into: Path, marker: Path, sha256: str) -> bool:
    try:
        return marker.read_text().strip() == sha256 and (into / "quarkus-run.jar").is_file()
    except OSError:
        return False


def app_home(cache: Path | None = None, mvn_args: Sequence[str] = (), pom: Path = POM) -> Path:
    """The unpacked application (the folder holding ``quarkus-run.jar``): from the cache when it is there, else
    resolved by Maven (:func:`resolve_archive`), checked (:func:`verify_archive`) and unpacked (:func:`unpack`).

    Args:
        cache: the cache folder (default :func:`default_cache`); the application goes to
            ``<cache>/apicurio-registry-app-<APP_VERSION>``.

    Raises:
        RegistrySetupError: Maven, the download, the checksums or the unpacking failed (the message says which).
    """
    cache = default_cache() if cache is None else cache
    into = cache / f"apicurio-registry-app-{APP_VERSION}"
    if _unpacked(into, into / ".unpacked", APP_SHA256):
        return into
    archive = resolve_archive(mvn_args, pom, scratch=cache)
    verify_archive(archive)
    return unpack(archive, into)


@contextlib.contextmanager
def _flocked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (blocking) for the block."""
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
