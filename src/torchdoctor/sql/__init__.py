"""DuckDB over torchdoctor's tables: external access off, time-limited, schema `python`."""
