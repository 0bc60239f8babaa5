import sys

from foxhunt_obs.cli import main

sys.exit(main())
