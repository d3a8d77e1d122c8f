"""Small project-made sample traces (generated from the YAML specs beside them, never real traces)."""
