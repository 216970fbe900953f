"""No models: the programs of the scorecard do not use any."""
