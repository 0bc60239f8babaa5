"""constraints/py<X.Y>.txt: the versions `make test` passed with. Every dependency pyproject.toml names (the
package's, its extras', the exporter's) is pinned there, at a version its range allows: a dependency added
or re-ranged without `make constraints` fails here, not in a user's fresh install."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
FILES = sorted((REPO / "constraints").glob("py*.txt"))
SELF = {"foxhunt-obs", "foxhunt-obs-exporter"}


def pins(path: Path) -> dict[str, Version]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version.strip(), f"{path.name}: not an exact pin: {line!r}"
            out[canonicalize_name(name)] = Version(version.strip())
    return out


def requirements() -> list[Requirement]:
    reqs = []
    for pyproject in (REPO / "pyproject.toml", REPO / "exporter" / "pyproject.toml"):
        project = tomllib.loads(pyproject.read_text())["project"]
        lists = [project.get("dependencies", []), *project.get("optional-dependencies", {}).values()]
        reqs += [Requirement(r) for deps in lists for r in deps]
    return [r for r in reqs if canonicalize_name(r.name) not in SELF]


def test_there_is_the_file_the_image_and_make_install_use():
    assert [f.name for f in FILES] == ["py3.11.txt"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_dependency_is_pinned_within_its_range(path):
    python = re.fullmatch(r"py(\d+\.\d+)\.txt", path.name).group(1)
    pinned = pins(path)
    assert len(pinned) > 100  # a whole environment, not a hand-picked few
    for req in requirements():
        if req.marker and not req.marker.evaluate({"python_version": python}):
            continue
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req} is not in {path.name}: run `make constraints`"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{path.name} pins {name}=={pinned[name]}, outside pyproject's {req}: run `make constraints`"
        )
