"""One table of every benchmark's latest results (bench/results/*.json): when it ran, on what machine and
under what load, each ratio it measured against its alternative, and each target with its verdict.
`make bench` prints it after the benchmarks; `python bench/summary.py` prints it alone."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _find(d, key_part: str):
    """The first value under a key containing key_part, anywhere in d (the benches nest it differently)."""
    if isinstance(d, dict):
        for k, v in d.items():
            if key_part in k:
                return v
        for v in d.values():
            found = _find(v, key_part)
            if found is not None:
                return found
    return None


def _load(v) -> str:
    if isinstance(v, dict):
        before, after = (x[0] if isinstance(x, list) else x for x in (v.get("before"), v.get("after")))
        return f"{before}->{after}" if before is not None else "?"
    return "?" if v is None else str(v)


def _number(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _verdicts(check: dict) -> list[str]:
    """A target check as lines: nested {value, target, ok} entries, or flat *_ok flags beside values."""
    lines = []
    for name, c in check.items():
        if isinstance(c, dict) and "ok" in c:
            lines.append(
                f"{name} = {_number(c['value'])} (target {c['target']}): {'ok' if c['ok'] else 'MISSED'}"
            )
        elif isinstance(c, bool):
            lines.append(f"{name}: {'ok' if c else 'MISSED'}")
        else:
            lines.append(f"{name} = {_number(c)}")
    return lines


def main() -> None:
    for path in sorted(RESULTS.glob("*.json")):
        r = json.loads(path.read_text())
        machine = r.get("machine", {})
        print(
            f"== {r.get('benchmark', path.stem)}  ({r.get('when', '?')}, {machine.get('cpus', '?')} CPUs, "
            f"load {_load(_find(r, 'load_average'))})"
        )
        for name, v in (r.get("ratios") or {}).items():
            if isinstance(v, (int, float)):
                print(f"   ratio  {name:44} {_number(v)}")
        if isinstance(r.get("target_check"), dict):
            for line in _verdicts(r["target_check"]):
                print(f"   target {line}")
        elif isinstance(r.get("targets"), dict):
            met = r.get("met") if isinstance(r.get("met"), dict) else {}
            for name, target in r["targets"].items():
                verdict = {True: ": ok", False: ": MISSED"}.get(met.get(name), "")
                print(f"   target {name} {target}{verdict}")


if __name__ == "__main__":
    main()
