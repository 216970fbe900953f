"""The memory doctor: tensor census, out-of-memory capture, fix estimates, batch-size finder."""
