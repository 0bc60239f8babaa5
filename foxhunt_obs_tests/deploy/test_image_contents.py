"""The code location's image carries the code location, not the demo: the build context that
deploy/dagster/Dockerfile.dockerignore admits has no sandbox, and the definitions and the CLI's production
commands work from that context alone."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from foxhunt_obs_tests.paths import REPO

IGNORE = REPO / "deploy" / "dagster" / "Dockerfile.dockerignore"


def _pattern(rule: str) -> re.Pattern:
    """A .dockerignore pattern (Go's filepath.Match plus `**`, as BuildKit reads it) as a regex over a
    path relative to the context."""
    out, i = "", 0
    while i < len(rule):
        if rule.startswith("**", i):
            out, i = out + ".*", i + 2
        elif rule[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif rule[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(rule[i]), i + 1
    return re.compile(out)


def admitted(path: str, rules: list[str]) -> bool:
    """Whether the context keeps `path`: the last rule matching it or a folder above it decides."""
    parts = path.split("/")
    keep = True
    for rule in rules:
        negated = rule.startswith("!")
        regex = _pattern(rule.lstrip("!").strip("/"))
        if any(regex.fullmatch("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            keep = negated
    return keep


def build_context(dest):
    rules = [ln.strip() for ln in IGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    kept = [f for f in files.splitlines() if admitted(f, rules) and (REPO / f).is_file()]
    for f in kept:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
    return kept


def test_the_matcher_reads_dockerignore_as_buildkit_does():
    rules = ["*", "!foxhunt_obs/", "foxhunt_obs/sandbox/", "**/__pycache__"]
    assert admitted("foxhunt_obs/defs/gpu/assets.py", rules)
    assert not admitted("foxhunt_obs/sandbox/story/scenario.py", rules)
    assert not admitted("foxhunt_obs/lib/__pycache__/lake.cpython-311.pyc", rules)
    assert not admitted("bench/report.py", rules)  # `*` takes every top-level entry
    assert not admitted("Makefile", rules)


@pytest.mark.servers
def test_the_image_has_no_sandbox_and_still_serves_the_code_location(tmp_path):
    ctx = tmp_path / "context"
    kept = build_context(ctx)
    assert "foxhunt_obs/definitions.py" in kept and "pyproject.toml" in kept
    assert not [f for f in kept if f.startswith("foxhunt_obs/sandbox/")]
    assert (REPO / "foxhunt_obs/sandbox/__init__.py").is_file()  # the repository has it: the rule left it out

    # Python run from the context alone, as in the image: the checkout's editable install (a finder on
    # sys.meta_path that would answer for foxhunt_obs.sandbox) is taken out before anything is imported
    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '').lower()]\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ctx}:{boot}", "FOXHUNT_LAKE": str(tmp_path / "lake")}

    def py(*args):
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)

    loaded = py("-c", """
import importlib.util, sys
import foxhunt_obs
assert foxhunt_obs.__file__.startswith(sys.argv[1]), foxhunt_obs.__file__
assert importlib.util.find_spec("foxhunt_obs.sandbox") is None
from foxhunt_obs.definitions import defs
d = defs()
print(len(list(d.resolve_all_asset_keys())), len(d.resolve_all_job_defs()), len(list(d.sensors or [])))
""", str(ctx))
    assert loaded.returncode == 0, loaded.stderr
    assets, jobs, sensors = map(int, loaded.stdout.split())
    assert assets > 10 and jobs > 3 and sensors > 0, loaded.stdout

    ddl = py("-m", "foxhunt_obs.cli", "lake", "ddl", "--location", "s3://bucket/lake")
    assert ddl.returncode == 0, ddl.stderr
    assert "CREATE EXTERNAL TABLE" in ddl.stdout and "s3://bucket/lake/gpu_samples" in ddl.stdout

    demo = py("-m", "foxhunt_obs.cli", "demo")
    assert demo.returncode == 2 and "the sandbox is not installed here" in demo.stderr, demo.stderr
