"""Capacity-planning experiments: the YAML schema, points and runs, the runner, results and reports."""
