"""Experiment files (``experiments/*.toml``): a sweep of ``innet run`` command lines, run and reported as
CSV, JSON and a figure (``innet reproduce``)."""
