"""What changed between two runs: pure functions over two runs' recorded tables and meta.json.

facts.py gathers one run's facts with SQL (a saved run or job, or a live process); stats.py
says whether a difference is real or noise; timing.py (step, phases, modules, ranks,
collectives), memory.py, curves.py (loss and gradient norm) and settings.py (how they were run)
compare; headline.py ties it into one sentence; gate.py judges `--fail-if`; build.py makes
the record (record.py's Comparison, a tree of frozen dataclasses) that the CLI prints and the
report shows.
"""
