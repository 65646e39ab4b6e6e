"""One module per `repro` sub-command (see repro/cli.py)."""
