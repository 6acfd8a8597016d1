"""`python -m lopd_ray.build_bank`: lopd_ray/cli/build_bank.py."""
import sys

from lopd_ray.cli.build_bank import main

if __name__ == "__main__":
    sys.exit(main())
