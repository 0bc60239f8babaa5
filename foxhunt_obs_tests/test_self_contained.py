"""The repository cites only what it holds.

Every text file git knows (tracked, or new and not ignored) is scanned, line by line, for two kinds of
reference a clone cannot follow:

* a document the repository lacks: the design document and the seed and issue texts it was built from
  (a file under a ``shared/`` folder beside the checkout, ``DESIGN.md``, "DESIGN §n", "SEEDS", "seed 000",
  "issue 16 §4"). An issue or pull request of a public project is fine when its project is named right
  before it, ``NVIDIA/dcgm-exporter issue #713`` or ``ray-project/ray#28799``, or the line holds a
  https://github.com/... URL. The name must be a GitHub owner/repo: not a file (``lib/lake.py issue 19``),
  not a path of three parts, not a column (``gpu_samples/hour issue 12``: no '_' in an owner's name).
* a relative link that leads nowhere: a path under a top-level folder of the repository written in a
  comment or prose (``docs/cost-model.md``, ``foxhunt_obs/data/alert_rules.yaml``), or a Markdown link
  (``[x](../design.md#layout)``), to a file that does not exist or to an anchor that no heading of a
  Markdown page makes (MkDocs' slugs: lower case, punctuation dropped, spaces to '-').

A failure names each file:line and what it found there. This file itself is not scanned: it spells the
patterns it looks for.
"""

import re
import subprocess
import unicodedata
from bisect import bisect_right
from functools import cache
from pathlib import Path

from foxhunt_obs_tests.paths import REPO

SELF = Path(__file__).resolve().relative_to(REPO).as_posix()

# Documents outside the repository. Case matters for DESIGN/SEEDS (the documents' own spelling), not for
# "seed 000" or "issue 16".
OUTSIDE = [
    (re.compile(r"(?<![\w.-])(?:\.\./)*shared/"), "a file of the shared/ folder outside the repository"),
    (re.compile(r"\bDESIGN\b"), "the design document (outside the repository)"),
    (re.compile(r"\bSEEDS?\b"), "the seed documents (outside the repository)"),
    (re.compile(r"\bseeds?[ _#-]?\d+(?!\d)", re.I), "a seed document (outside the repository)"),
]
ISSUE = re.compile(r"(?<![\w/.-])(?:issues?|PRs?|pull requests?)\s*#?\d+", re.I)
# A line with a GitHub URL names the project of its issue numbers.
GITHUB_URL = re.compile(r"github\.com/[\w.-]+/[\w.-]+", re.I)
# A GitHub owner/repo right before an issue ("NVIDIA/dcgm-exporter issue #713", "ray-project/ray's PR 5"):
# an owner is letters, digits and single inner hyphens; neither part of a longer path.
PROJECT_BEFORE = re.compile(
    r"(?<![\w./-])[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}/(?P<repo>[\w.-]+)(?:'s)?`?\s+$"
)
# A repo name ending like a file is a file: lib/lake.py, docs/design.md.
FILE_EXTENSION = re.compile(
    r"\.(?:py|md|ya?ml|json|sql|toml|sh|txt|tsv|csv|prom|html|j2|cfg|ini|rst|cc?|cpp|h|go|rs|ts|proto)$", re.I
)

MD_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
MD_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ID = re.compile(r"\{[^}]*#([\w-]+)[^}]*\}\s*$")
MD_ANY_LINK = re.compile(r"\]\(|^\s{0,3}\[[^\]]+\]:", re.M)
FENCE = re.compile(r"^\s*(```|~~~)")


def _tracked_text_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    files = []
    for rel in sorted(set(filter(None, out.split("\0")))):
        path = REPO / rel
        if rel == SELF or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        files.append(rel)
    return files


FILES = _tracked_text_files()
TOP_FOLDERS = sorted({rel.split("/", 1)[0] for rel in FILES if "/" in rel} | {"docs"})
# A path under a top-level folder, written bare in prose or a comment: docs/x.md, foxhunt_obs/data/y.yaml.
# Not one inside a longer path or URL (preceded by a word character, '/', '.', '-' or '~'), nor a pattern
# (<placeholder>, *, {a,b}: the path stops before those, and a path that stops there is not checked).
BARE_PATH = re.compile(
    r"(?<![\w/.~:-])((?:" + "|".join(map(re.escape, TOP_FOLDERS)) + r")/[\w./-]*[\w-]\."
    r"(?:md|py|ya?ml|json|sql|toml|sh|txt|tsv|csv|prom|html|j2|cfg|ini))"
    r"(#[\w-]+)?(?!\.?[\w*<{$/-])"
)
# Another project's path, named after the project ("grafana/tempo docs/sources/...", "NVIDIA/x's docs/y.md").
OTHER_PROJECT_BEFORE = re.compile(r"\b[\w.-]+/[\w.-]+(?:'s)?\s+`?$")
# Samples from public sources, quoting their own repositories' paths.
QUOTES_OTHERS = ("foxhunt_obs_tests/fixtures/real/",)


def slug(heading: str) -> str:
    """MkDocs' (Python-Markdown toc's) anchor of a heading: inline markup and punctuation dropped, lower
    case, runs of spaces and hyphens to one '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


@cache
def anchors(page: Path) -> frozenset[str]:
    found, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            explicit = EXPLICIT_ID.search(m.group(2))
            found.add(explicit.group(1) if explicit else slug(EXPLICIT_ID.sub("", m.group(2))))
    return frozenset(found)


def _broken(target: Path, anchor: str | None, shown: str) -> str | None:
    """Why a link to target (resolved) with anchor is broken, or None."""
    try:
        target.relative_to(REPO)
    except ValueError:
        return f"{shown}: outside the repository"
    if not target.exists():
        return f"{shown}: no such file"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{shown}: no heading of {target.relative_to(REPO).as_posix()} has the anchor #{anchor}"
    return None


def _public_issue(line: str, issue: re.Match) -> bool:
    """The issue's project is named: an owner/repo right before it, or a GitHub URL on the line."""
    if GITHUB_URL.search(line):
        return True
    m = PROJECT_BEFORE.search(line[: issue.start()])
    return m is not None and not FILE_EXTENSION.search(m.group("repo"))


def _outside_references(line: str) -> list[str]:
    found = [f"{m.group(0)!r}: {why}" for pattern, why in OUTSIDE for m in pattern.finditer(line)]
    found += [
        f"{m.group(0)!r}: an issue with no public project named right before it (write owner/repo#N, "
        "owner/repo issue N or a github.com URL, or state the fact)"
        for m in ISSUE.finditer(line)
        if not _public_issue(line, m)
    ]
    return found


def _markdown_links(rel: str, line: str) -> list[str]:
    found = []
    here = (REPO / rel).parent
    targets = [m.group(1) for m in MD_LINK.finditer(line)]
    if m := MD_REF_DEF.match(line):
        targets.append(m.group(1))
    for url in targets:
        if re.match(r"^[a-zA-Z][\w+.-]*:", url) or url.startswith("//"):
            continue  # http:, https:, mailto:
        path, _, anchor = url.partition("#")
        target = (here / path).resolve() if path else (REPO / rel).resolve()
        if why := _broken(target, anchor or None, url):
            found.append(why)
    return found


def _bare_paths(rel: str, line: str, markdown: bool) -> list[str]:
    """Paths written bare, each resolved from the repository's root or from a folder above the file
    (exporter/README.md's deploy/README.md is exporter/deploy/README.md). A path into a folder the
    repository lacks is another project's (grafana/tempo's docs/sources/...), not checked."""
    if rel.startswith(QUOTES_OTHERS):
        return []
    found = []
    bases = [REPO / p for p in reversed(Path(rel).parents)]  # the root first, then the file's folders
    for m in BARE_PATH.finditer(line):
        before = line[: m.start()]
        if (markdown and before.endswith("](")) or OTHER_PROJECT_BEFORE.search(before):
            continue  # a Markdown link's target (relative to the page, see _markdown_links); another project's
        candidates = [(base / m.group(1)).resolve() for base in bases]
        if any(c.exists() for c in candidates):
            target = next(c for c in candidates if c.exists())
        elif any(c.parent.is_dir() for c in candidates):
            target = next(c for c in candidates if c.parent.is_dir())
        else:
            continue
        if why := _broken(target, (m.group(2) or "#")[1:] or None, m.group(0)):
            found.append(why)
    return found


def scan(rel: str) -> list[str]:
    """The problems of one file, file:line each. Each pattern runs over the whole text once; only the lines
    it hits are looked at closely."""
    markdown = rel.endswith(".md")
    text = (REPO / rel).read_text(encoding="utf-8")
    lines = text.split("\n")
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    patterns = [pattern for pattern, _ in OUTSIDE] + [ISSUE, BARE_PATH] + ([MD_ANY_LINK] if markdown else [])
    hit = sorted({bisect_right(starts, m.start()) - 1 for p in patterns for m in p.finditer(text)})
    problems = []
    for i in hit:
        line = lines[i].rstrip("\r")
        found = _outside_references(line) + _bare_paths(rel, line, markdown)
        if markdown:
            found += _markdown_links(rel, line)
        problems += [f"{rel}:{i + 1}: {why}" for why in found]
    return problems


def test_the_scan_covers_the_repository():
    """Not vacuous: the scan reads the package, the tests, the deploy files and the docs."""
    assert len(FILES) > 300
    for expected in (
        "README.md",
        "foxhunt_obs/lib/lake.py",
        "foxhunt_obs/data/alert_rules.yaml",
        "deploy/prometheus/foxhunt-rules.yaml",
        "exporter/README.md",
    ):
        assert expected in FILES
    assert {"foxhunt_obs", "foxhunt_obs_tests", "deploy", "exporter", "docs"} <= set(TOP_FOLDERS)


def test_the_patterns_catch_what_they_must():
    """Each kind of reference is caught, and the public forms pass."""
    for bad in (
        "see ../shared/DESIGN.md",
        "(DESIGN §5)",
        "seed 000's trap",
        "Seed 003 component 5",
        "SEED_000_NODE_QUERIES",
        "issue 16 §4",
        "Issue 13 §2: a typo",
        "(issue #28799, done)",
        "dcgm-exporter issue #713 shows",
        "the SEEDS",
        "see lib/lake.py issue 19",
        "gpu_samples/hour issue 12 §3",
        "foxhunt_obs/lib/lake.py issue 19",
        "a/b/c issue 4",
        "NVIDIA/dcgm-exporter is fine, but issue 16 is ours",
        "ray-project/ray issue #14613: PR #14184",
        "docs/design.md's issue 3",
    ):
        assert _outside_references(bad), bad
    for good in (
        "NVIDIA/dcgm-exporter issue #713",
        "ray-project/ray#28799",
        "ray-project/ray's PR 14184",
        "`NVIDIA/dcgm-exporter` issues #713 and #512",
        "pytorch/pytorch.github.io issue 7",
        "see issue #512 (https://github.com/NVIDIA/dcgm-exporter/issues/512)",
        "https://github.com/NVIDIA/dcgm-exporter/issues/512",
        "the fixture pods-issue512.prom",
        "random seed=42",
        "the seed of the generator",
        "an issue with the design",
    ):
        assert not _outside_references(good), good
    assert _bare_paths("x.py", "# (docs/no-such-page.md)", False)
    assert _bare_paths("x.py", "# foxhunt_obs/lib/no_such_module.py", False)
    assert not _bare_paths("x.py", "# foxhunt_obs/lib/lake.py and foxhunt_obs/data/<name>.yaml", False)
    assert _bare_paths("x.py", "# README.md is fine, exporter/README.md#no-such-heading is not", False)
    assert not _bare_paths(
        "x.py", "# exporter/README.md#sm-activity-nvml-gpm, exporter/README.md#fake-mode", False
    )
    assert not _bare_paths("exporter/x.md", "see deploy/README.md (exporter/deploy/README.md)", True)
    assert _markdown_links("docs/x.md", "[a](../README.md) and [b](no-such.md)") == [
        "no-such.md: no such file"
    ]
    assert slug("The `spend_now` table: what, & why?") == "the-spend_now-table-what-why"


def test_no_reference_leaves_the_repository():
    problems = [p for rel in FILES for p in scan(rel)]
    assert not problems, "references a clone cannot follow:\n" + "\n".join(problems)
