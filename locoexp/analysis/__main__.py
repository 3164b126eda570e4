"""`python -m locoexp.analysis <command>` (console script `locoexp-analysis`).

    compare BASELINE OURS               Appendix A: two arms (each a run, or a folder of launches)
    compare SWEEP --baseline K=V --ours K=V   the arms picked out of a sweep by config values
    accounting --co RUN --da RUN        Appendix C's Eq. 4 terms measured from two runs
    accounting --o 0.32 --a 0.58 --f 0.23 --dl 0.49 --tau 0.03   Eq. 4 from given terms
    accounting --eq2 ... / --eq3 ... / --decode-premium ...      trade-offs 1-3
    accounting --ratio-model --t-pw ... --t-loco ...             Appendix E.1
    accounting --recommend --co RUN [--da RUN ...] [--splits 0.5 ...]    da per split, modelled
    cost RUN [RUN ...] [--against RUN ...] [--target 0.85]       Appendix I, Tables I2 and I6
    figures RUN_OR_SWEEP [...] --out DIR [--only fig4 ...]       the paper's figures as PNG
    predict EXPERIMENT | RUN | OVERRIDES [--anchors]             Eq. 2 from compiled programs

Every command prints a table on stdout, or with --json the same as JSON. Bad input exits 2
with one sentence. Never imports jax.
"""

import argparse
import json
import sys
from collections.abc import Sequence

from locoexp.errors import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="locoexp-analysis", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    from locoexp.analysis import cli, predict_cli  # noqa: PLC0415  (keeps --help fast)

    cli.add_compare(commands)
    cli.add_accounting(commands)
    cli.add_cost(commands)
    cli.add_figures(commands)
    predict_cli.add_predict(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.run(args)
    except (ConfigError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2, default=str))
    else:
        print(args.format(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
