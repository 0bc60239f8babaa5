"""The sandbox's story: a scenario, the ground truth it implies, and the alerts it must raise."""
