"""`kvplan calibrate`: drive the engine through designed steps and fit the calibrated cost model."""
