from omni_mp.cli import cli

if __name__ == "__main__":
    cli()
