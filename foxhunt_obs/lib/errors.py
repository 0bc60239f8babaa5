"""The one base class of the errors that are an input's fault, not a bug.

An input is whatever the code does not own: a source's answer (Prometheus, MLflow, AWS), the lake's
partitions, a data file or a user's override, a destination that refuses what is sent. When one of those is
missing, malformed or refuses, the function raises a subclass of `InputError` whose message names the input
and what to do; a table function's `InputError` fails its Dagster step with that message alone, scrubbed, and
no traceback (foxhunt_obs/assetkit.py). Any other exception is a bug and keeps its traceback.

A subclass keeps its older base too (`class PriceError(InputError, ValueError)`), so a caller that catches
`ValueError` or `RuntimeError` still does.
"""


class InputError(Exception):
    """An input's fault, not a bug: the message names the input (never a secret) and what to do."""
