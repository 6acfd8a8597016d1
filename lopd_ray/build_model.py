"""`python -m lopd_ray.build_model`: lopd_ray/cli/build_model.py."""
import sys

from lopd_ray.cli.build_model import main

if __name__ == "__main__":
    sys.exit(main())
