"""Command line: ``python -m steer_widgets export NOTEBOOK.ipynb OUT.html``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m steer_widgets")
    commands = parser.add_subparsers(dest="command", required=True)
    exp = commands.add_parser(
        "export",
        help="execute a notebook and write a self-contained HTML page (widgets included)",
        description=(
            "Execute NOTEBOOK in a fresh kernel and write OUT as one HTML file whose widgets "
            "(explorer completions and heatmaps) render from file:// without a kernel or a "
            "network connection."
        ),
    )
    exp.add_argument("notebook", help="the .ipynb to export")
    exp.add_argument("out", help="the .html file to write")
    exp.add_argument(
        "--no-execute",
        action="store_true",
        help="use the notebook's stored outputs and widget state instead of running it",
    )
    exp.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    exp.add_argument("--kernel", default="python3", help="kernel name (default python3)")
    args = parser.parse_args(argv)

    from .export import ExportError, export

    try:
        out = export(
            args.notebook,
            args.out,
            run=not args.no_execute,
            timeout=args.timeout,
            kernel_name=args.kernel,
        )
    except (ExportError, OSError) as err:
        print(f"export failed: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
