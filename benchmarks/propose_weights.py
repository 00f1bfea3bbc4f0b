"""How well proposals fit their source, and the reranking weights that fit them best (issue 48).

Usage: python -m benchmarks.propose_weights --table FILTERED_TABLE --model RNN.pt --reverse-model REVERSE.pt
       --lex-e2f lex.e2f --lex-f2e lex.f2e --text DEV.tok.tc.en --reference DEV.tok.tc.fr
       [--sentences 100] [--beam 40] [--plain-beam 10] [--per-source 5]
       [--reverse 0,0.25,0.5,1,1.5,2] [--length 0,0.5,1,2] [--threads 2]

The figures and the rule are table1.rerank_choice's (its module doc says what they measure); this
prints every point of the grid and the choice, and also today's proposals (no reverse model: the
best ``--per-source`` of a ``--plain-beam`` search) and the search's speed at both beams. Run it on
dev text only: ``--measure`` prints the points' figures on other text (test) without choosing.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", type=Path, required=True, help="the (filtered) phrase table proposals complete")
    parser.add_argument("--model", required=True)
    parser.add_argument("--reverse-model", required=True)
    parser.add_argument("--lex-e2f", required=True)
    parser.add_argument("--lex-f2e", required=True)
    parser.add_argument("--text", type=Path, required=True, help="tokenised, truecased source text (dev)")
    parser.add_argument("--reference", type=Path, required=True, help="its tokenised, truecased reference")
    parser.add_argument("--sentences", type=int, default=None, help="the text's first N sentences [all]")
    parser.add_argument("--beam", type=int, default=None, help="the reranked search's beam [rerank.RERANK_BEAM]")
    parser.add_argument("--plain-beam", type=int, default=10, help="today's beam without a reverse model")
    parser.add_argument("--per-source", type=int, default=5)
    parser.add_argument("--thin-below", type=int, default=3)
    parser.add_argument("--reverse", default="0,0.25,0.5,1,1.5,2", help="λ values")
    parser.add_argument("--length", default="0,0.5,1,2", help="μ values")
    parser.add_argument("--measure", action="store_true",
                        help="print each point's figures and choose nothing (text other than dev: test)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    return parser.parse_args()


def main() -> None:
    args = _arguments()

    from table1.rerank_choice import ChoiceInputs, RerankGrid, choose_point, grid_figures

    inputs = ChoiceInputs(args.table, Path(args.model), Path(args.reverse_model), Path(args.lex_e2f),
                          Path(args.lex_f2e), args.per_source, args.thin_below)
    grid = RerankGrid(args.sentences, tuple(_floats(args.reverse)), tuple(_floats(args.length)))
    points = grid_figures(inputs, args.text, args.reference, grid, args.device, args.threads, print, args.beam,
                          args.plain_beam)
    if len(points) > 1 and not args.measure:
        print(choose_point(points)[1])


if __name__ == "__main__":
    main()
