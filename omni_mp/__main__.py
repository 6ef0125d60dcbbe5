"""`python -m omni_mp`: the command line (omni_mp.cli), as `python -m omni_mp.launch` and `omni-mp`."""

from omni_mp.cli import cli

if __name__ == "__main__":
    cli()
