"""`torchdoctor ckpt`: what a checkpoint holds, whether it loads into a model, and the fix.

`reader` reads a file's structure without running its code or loading its tensors; `summary`
turns it into data (nesting, tensors, bytes, dtypes, devices, state dicts) and asks torch's own
`weights_only` loader whether the file loads without code; `keys` compares a state dict with a
model's and finds the remap; `fix` writes the repaired state dict; `factory` builds the user's
model from `PATH.py:FACTORY`. Rendering lives in torchdoctor.report.checkpoint.
"""
