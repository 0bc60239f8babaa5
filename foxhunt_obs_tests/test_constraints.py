"""constraints/py3.11.txt: the versions `make test` passed with. Every dependency that `make install`
installs (the package's with the extras the Makefile names, the exporter's likewise) is pinned there, at a
version its pyproject range allows: a dependency added or re-ranged without `make constraints` fails here,
not in a user's fresh install."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints" / "py3.11.txt"  # the image's Python (deploy/dagster/Dockerfile)


def pins() -> dict[str, Version]:
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version.strip(), f"{CONSTRAINTS.name}: not an exact pin: {line!r}"
            out[canonicalize_name(name)] = Version(version.strip())
    return out


def installed_requirements() -> list[Requirement]:
    """What `make install` asks pip for: each `-e '<dir>[<extras>]'` of the Makefile's PACKAGES, with the
    extras' own references to the package (foxhunt_obs[deploy]) followed."""
    line = next(x for x in (REPO / "Makefile").read_text().splitlines() if x.startswith("PACKAGES :="))
    targets = re.findall(r"-e '([^'\[]+)\[([^\]]*)\]'", line)
    assert [d for d, _ in targets] == [".", "./exporter"], line
    reqs: list[Requirement] = []
    for folder, extras in targets:
        project = tomllib.loads((REPO / folder / "pyproject.toml").read_text())["project"]
        own, todo, seen = canonicalize_name(project["name"]), list(extras.split(",")), set()
        reqs += [Requirement(r) for r in project["dependencies"]]
        while todo:
            extra = todo.pop()
            if extra in seen:
                continue
            seen.add(extra)
            for r in map(Requirement, project["optional-dependencies"][extra]):
                if canonicalize_name(r.name) == own:
                    todo += r.extras
                else:
                    reqs.append(r)
    return reqs


def test_every_dependency_make_install_installs_is_pinned_within_its_range():
    pinned = pins()
    assert len(pinned) > 100  # a whole environment, not a hand-picked few
    reqs = installed_requirements()
    names = {canonicalize_name(r.name) for r in reqs}
    assert {"dagster", "dagster-k8s", "pytest", "grpcio"} <= names  # main, deploy via dev, the exporter's
    for req in reqs:
        if req.marker and not req.marker.evaluate(
            {"python_version": "3.11", "python_full_version": "3.11.0"}
        ):
            continue
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req} is not in {CONSTRAINTS.name}: run `make constraints`"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{CONSTRAINTS.name} pins {name}=={pinned[name]}, outside pyproject's {req}: run `make constraints`"
        )
