"""Built-in hardware and model specifications for the analytic cost model (no weights needed)."""
