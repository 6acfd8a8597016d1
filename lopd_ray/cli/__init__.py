"""The commands: each runs the start-up path of lopd_ray/startup.py, and `python -m lopd_ray.<name>` runs
lopd_ray/cli/<name>.py (the package root keeps one line per command for that)."""
