"""How a source's error becomes a failed Dagster step: its text scrubbed of every configured secret
(lib/redact.py), and raised `from None` so no chained exception carries the raw text into the event log."""

import dagster as dg

from foxhunt_obs.lib.redact import scrub


def failure(e: BaseException, prefix: str = "") -> dg.Failure:
    return dg.Failure(description=scrub(f"{prefix}{e}"))
