"""`repro data --out DIR`: write the tiny-math train and held-out sets as DAPO-layout parquet files."""

from repro.data.tinymath import write_tiny_math


def add_arguments(parser):
    parser.add_argument("--out", required=True, help="folder to write train.parquet and held_out.parquet into")
    parser.add_argument("--digits", type=int, default=2, choices=(1, 2, 3),
                        help="operand width (difficulty): 1, 2 or 3")
    parser.add_argument("--seed", type=int, default=0, help="order of the training rows")


def run(args) -> int:
    for split, path in write_tiny_math(args.out, digits=args.digits, seed=args.seed).items():
        print(f"{split}: {path}")
    return 0
