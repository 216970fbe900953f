"""The seeds' debugging recipes run on the user's unchanged script, inside its process:
`overfit` (feed the first batch again and again; did the model memorise it, and if not, why)
and `repro` (two runs compared step by step; what differs first, and which source of
randomness was used without a seed).

A recipe is switched on only in a process that the `overfit`/`repro` verb starts for it (see
torchdoctor.cli.recipe_run): a normal run never loads this package. In that process the mode
installs its own hooks next to the Recorder's and counts steps through the Recorder's
`step_listeners`; everything it adds is removed before the probe stops.
"""
