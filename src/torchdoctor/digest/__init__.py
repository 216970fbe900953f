"""The data a run report shows, gathered from the tables of a live or saved run."""
