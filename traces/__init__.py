"""Request records, loaders for public trace formats, transforms and synthetic workloads."""
