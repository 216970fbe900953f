"""Columnar ring tables in memory, spilled to the run directory; the same tables read back."""
