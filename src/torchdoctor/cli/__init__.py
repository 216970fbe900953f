"""The `torchdoctor` command: one module per verb under commands/, registered in main.COMMANDS."""
