"""The sandbox (DESIGN §8): a scenario's cluster played by real local servers. story/ says what happens, writers/ put it in each source's own format, servers/ run the processes that serve it."""
