"""`torchdoctor lint`: static checks of training code for the anti-patterns that make runs
slow, leak memory, diverge or hang. One module per family of rules in lint/rules/, each rule
with a stable code (TDnnn) and its documentation; the engine walks files, applies
`# noqa: CODE` and --select/--ignore. Never imports torch.
"""
