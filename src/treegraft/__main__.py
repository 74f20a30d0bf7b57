"""`python -m treegraft ...`: the `treegraft` command, for an environment whose scripts folder is
not on the PATH."""

from treegraft.cli import main

if __name__ == "__main__":
    main()
