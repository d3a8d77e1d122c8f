"""SimPy discrete-event model of the serving system, running the shared `engine.core` scheduler."""
