"""`foxhunt-obs lake ddl`: the Glue/Athena DDL of the lake on S3 (lib/athena.py), printed or written to a file."""

from __future__ import annotations

import sys
from pathlib import Path

from foxhunt_obs.lib.athena import DdlError, ddl_script
from foxhunt_obs.lib.settings import env, partitions_start


def lake_ddl(location: str | None, database: str, out: Path | None) -> int:
    """Write the DDL for ``location`` (default: the code location's lake root, FOXHUNT_LAKE) with projections
    from FOXHUNT_PARTITIONS_START (read like defs/partitions.py does) to NOW."""
    if location is None:
        from foxhunt_obs.cli import config

        location = config.lake().root
        if not location.startswith("s3://"):
            print(
                f"FOXHUNT_LAKE is {location!r}, not on S3: pass --location s3://bucket/prefix",
                file=sys.stderr,
            )
            return 2
    try:
        script = ddl_script(location, database, partitions_start(env("FOXHUNT_PARTITIONS_START")))
    except (DdlError, ValueError) as e:
        print(f"lake ddl: {e}", file=sys.stderr)
        return 2
    if out is None:
        sys.stdout.write(script)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(script)
        print(f"wrote {out}")
    return 0
