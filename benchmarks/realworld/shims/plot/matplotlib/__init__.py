"""A stand-in for matplotlib: the programs' figures become files of the numbers plotted, so
that a plain run and one under torchdoctor are compared on what they would have drawn."""


def use(backend: str) -> None:
    """The backend is chosen by the program (Agg): nothing to choose here."""
