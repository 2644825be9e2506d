"""Which of the project's dependencies the lent GPU machines' image lacks, and their wheels.

The image (``image-packages.txt`` beside this file) brings Python 3.12, torch 2.11 and most of
what the suite imports, but has no network: whatever else the suite needs travels as wheels in
the ignored folder ``.gpu/``. The list is derived, never kept by hand: the project's
dependencies (pyproject.toml, and the dev tools the GPU checks run: ``GPU_DEV``) that the image
lacks, then theirs, read from each wheel's metadata for the target Python, until every one is
either in the image or downloaded. Versions are the ones installed on this machine where it
has them (the versions the suite is tested with), else the newest that fits.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
IMAGE_LIST = Path(__file__).with_name("image-packages.txt")
#: the dev extras the GPU checks use on the GPU machine (ruff and the docs site stay here)
GPU_DEV = ("pytest", "pytest-xdist", "pytest-timeout", "nox")
#: what comes back from the device machine is at most this much (its working-tree limit,
#: shared with the repository itself)
LIMIT_BYTES = 64 * 2**20
#: manylinux tags of x86_64, newest first: pip matches a wheel's tag exactly
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def image_packages(path: Path = IMAGE_LIST) -> set[str]:
    """The image's packages, canonical names."""
    lines = path.read_text().splitlines()
    return {canonicalize_name(line.strip()) for line in lines
            if line.strip() and not line.startswith("#")}


def project_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[Requirement]:
    """The dependencies the suite runs with on a GPU machine: pyproject's, and ``GPU_DEV``."""
    project = tomllib.loads(pyproject.read_text())["project"]
    dev = [Requirement(r) for r in project["optional-dependencies"]["dev"]]
    return [Requirement(r) for r in project["dependencies"]] + [
        r for r in dev if canonicalize_name(r.name) in GPU_DEV]


def missing_requirements(image: set[str] | None = None) -> list[Requirement]:
    """The project's requirements the image lacks: the roots of what prepare downloads."""
    image = image_packages() if image is None else image
    return [r for r in project_requirements() if canonicalize_name(r.name) not in image]


def marker_environment(python_version: str) -> dict[str, str]:
    """What a requirement's marker sees on a manylinux x86_64 CPython ``python_version``."""
    major_minor = ".".join(python_version.split(".")[:2])
    return {"python_version": major_minor, "python_full_version": f"{major_minor}.0",
            "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "platform_machine": "x86_64", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "extra": ""}


def wheel_requirements(wheel: Path, python_version: str) -> list[Requirement]:
    """A wheel's own dependencies on ``python_version`` (its METADATA's Requires-Dist that
    apply there; extras left out)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    env = marker_environment(python_version)
    found = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        marker = requirement.marker
        if marker is not None and not Marker(str(marker)).evaluate(env):
            continue
        found.append(requirement)
    return found


def pinned(requirement: Requirement) -> str:
    """``name==version`` of this machine's copy where it satisfies the requirement, else the
    requirement itself (pip picks the newest that fits)."""
    try:
        here = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        here = None
    if here is not None and requirement.specifier.contains(Version(here), prereleases=True):
        return f"{requirement.name}=={here}"
    return f"{requirement.name}{requirement.specifier}"


def pip_download(spec: str, dest: Path, python_version: str) -> Path:
    """One wheel for CPython ``python_version`` on manylinux x86_64 (or a pure-Python one),
    without its dependencies; returns its path."""
    before = set(dest.glob("*.whl"))
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", python_version, "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    # quiet: pip warns about every configured index that lacks the package
    subprocess.run([*command, spec], check=True, capture_output=True, text=True)
    name = canonicalize_name(re.split(r"[=<>!~ ]", spec, maxsplit=1)[0])
    new = [w for w in set(dest.glob("*.whl")) - before
           if parse_wheel_filename(w.name)[0] == name] or [
        w for w in dest.glob("*.whl") if parse_wheel_filename(w.name)[0] == name]
    return new[0]


def tree_bytes(repo: Path = REPO) -> int:
    """What of the repository travels to the device machine: tracked files and untracked ones
    git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=repo, capture_output=True, check=True)
    paths = {repo / name for name in listed.stdout.decode().split("\0") if name}
    return sum(p.stat().st_size for p in paths if p.is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def prepare(dest: Path, python_version: str, image: set[str] | None = None,
            log=print) -> list[Path]:
    """The wheels of every dependency the image lacks, and of theirs, into ``dest`` (one
    version of each: the folder is emptied of other wheels first)."""
    image = image_packages() if image is None else image
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    queue = missing_requirements(image)
    taken: dict[str, Path] = {}
    while queue:
        requirement = queue.pop(0)
        name = canonicalize_name(requirement.name)
        if name in taken or name in image:
            continue
        spec = pinned(requirement)
        taken[name] = pip_download(spec, dest, python_version)
        log(f"  {taken[name].name}  ({spec})")
        queue += wheel_requirements(taken[name], python_version)
    return sorted(taken.values())
