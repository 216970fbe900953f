"""`torchdoctor ckpt FILE [--model PATH.py:FACTORY] [--fix OUT] [--key PATH] [--format json]`:
what a checkpoint holds (nesting, tensors, bytes, dtypes, the devices it was saved from) read
without running its code; with --model, whether it loads into the model with strict=True and
why not (a `module.` or `_orig_mod.` prefix, a wrapper prefix, a head with another number of
classes); with --fix, the state dict that does load.

Exit codes: 0 the file loads with weights_only=True (and strictly into the model, or --fix
wrote one that does); 1 it does not: the file needs code, the keys do not fit, the fix did
not succeed, or the file is corrupt, truncated or not a checkpoint; 2 usage errors: a missing
or unreadable file, a --model that does not give an nn.Module.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "ckpt"
SUMMARY = "a checkpoint's contents, read without running it; key mismatches with a model; fix"
TARGET = "none"
FORMATS = formats.REPORT


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a checkpoint (torch.save zip or legacy, or safetensors)")
    parser.add_argument(
        "--model",
        metavar="PATH.py:FACTORY",
        help="compare with the model FACTORY() returns (this runs PATH.py, your code)",
    )
    parser.add_argument(
        "--fix",
        metavar="OUT",
        help="write the state dict that loads with strict=True (without --model: the state "
        "dict alone, wrapper prefixes removed)",
    )
    parser.add_argument(
        "--key",
        metavar="PATH",
        help="the state dict to use, as a dotted path (model, ema, ...); default: the best fit",
    )


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.checkpoint.examine import examine
    from torchdoctor.checkpoint.factory import FactoryError
    from torchdoctor.checkpoint.reader import CheckpointError, Corrupt
    from torchdoctor.report import checkpoint as report

    try:
        data = examine(args.file, args.model, args.fix, args.key)
    except FileNotFoundError:
        raise CliError(f"ckpt: no such file: {args.file}") from None
    except IsADirectoryError:
        raise CliError(
            f"ckpt: {args.file} is a directory (torch.distributed.checkpoint directories are "
            "not read yet; give a file)"
        ) from None
    except PermissionError:
        raise CliError(f"ckpt: permission denied: {args.file}") from None
    except FactoryError as exc:
        raise CliError(f"ckpt: {exc}") from None
    except CheckpointError as exc:
        kind = "corrupt" if isinstance(exc, Corrupt) else "not_a_checkpoint"
        ctx.print(report.render_error(args.file, kind, str(exc), args.format))
        return TARGET_ERROR
    ctx.print(report.render_json(data) if args.format == "json" else report.render_text(data))
    return OK if data.status in ("ok", "fixed") else TARGET_ERROR
