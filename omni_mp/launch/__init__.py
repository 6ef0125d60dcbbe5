"""`python -m omni_mp.launch`: the documented name of the command line (omni_mp.cli)."""
