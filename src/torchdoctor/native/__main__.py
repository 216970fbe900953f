"""python -m torchdoctor.native [--force]: build torchdoctor's compiled module (the C++ collectives
kernel, sum_of_squares) for this torch."""

from __future__ import annotations

import argparse
import sys
import time

from torchdoctor import native


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m torchdoctor.native", description=__doc__)
    parser.add_argument("--force", action="store_true", help="build again even if built")
    args = parser.parse_args()
    path = native.built()
    if path is not None and not args.force:
        print(f"torchdoctor: the compiled module is built: {path}")
        return 0
    print("torchdoctor: building the compiled module (collectives, phase timer)...", flush=True)
    started = time.monotonic()
    try:
        path = native.build(force=args.force)
    except native.BuildError as exc:
        print(f"torchdoctor: not built: {exc}", file=sys.stderr)
        print(
            "torchdoctor: collective tracing will use its Python kernel, and the gradient norm"
            " torch's functions",
            file=sys.stderr,
        )
        return 1
    print(f"torchdoctor: built {path} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
