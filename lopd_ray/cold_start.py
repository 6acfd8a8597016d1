"""`python -m lopd_ray.cold_start`: lopd_ray/cli/cold_start.py."""
import sys

from lopd_ray.cli.cold_start import main

if __name__ == "__main__":
    sys.exit(main())
