"""`python -m tgictl` runs the same command line as the `tgictl` script."""

from tgictl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
