"""One module per `repro` sub-command (see repro/cli.py).

A command module imports what pulls torch, transformers, pandas, matplotlib or Ray inside its ``run``, so that
``repro <command> --help`` stays fast; the package's light modules it imports at the top.
"""
