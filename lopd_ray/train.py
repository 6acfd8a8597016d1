"""`python -m lopd_ray.train`: lopd_ray/cli/train.py."""
import sys

from lopd_ray.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
