"""One module per verb; see torchdoctor.cli.main.COMMANDS."""
