"""`python -m lopd_ray.eval`: lopd_ray/cli/eval.py."""
import sys

from lopd_ray.cli.eval import main

if __name__ == "__main__":
    sys.exit(main())
