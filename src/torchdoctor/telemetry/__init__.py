"""What the training did, recorded by hooks that can always be removed."""
