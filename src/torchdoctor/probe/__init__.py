"""The endpoint inside the training process: HTTP over a Unix socket (or TCP with a token)."""
