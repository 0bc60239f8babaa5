"""Where the tests find the repository and the real-sample fixtures, wherever a test module sits."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "foxhunt_obs_tests" / "fixtures"
REAL = FIXTURES / "real"  # samples from public sources, each file citing its own
