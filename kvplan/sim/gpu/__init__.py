"""What one GPU operation costs: Vidur-format profile tables, the shape-aware analytic laws fitted on them, the
attention kernels' cost, and how far each source is off (its validation error). `sim.cost` composes these into
a scheduler step's time."""
