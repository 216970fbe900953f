"""The error catalog behind `torchdoctor explain` and `torchdoctor.explain()`.

One module per family of errors (memory, cuda, distributed, ...), each a tuple ENTRIES of
catalog entries with stable codes; `catalog` holds the entry type and the registry, `extract`
finds the error that matters in a noisy log, `api` builds the Explanation. Rendering lives in
torchdoctor.report.explanation. Nothing here imports torch.
"""
