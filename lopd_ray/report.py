"""`python -m lopd_ray.report`: lopd_ray/cli/report.py."""
import sys

from lopd_ray.cli.report import main

if __name__ == "__main__":
    sys.exit(main())
