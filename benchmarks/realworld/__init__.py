"""The real-world scorecard's definitions: the public programs (programs.py), the synthetic
data they are given (data.py, shims/), and the bugs planted in them (bugs.py). The runner is
benchmarks/realworld.py; nothing fetched is ever committed, only these descriptions."""
