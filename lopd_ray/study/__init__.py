"""Studies: a grid of (method x seed) and ablations run as ordinary training runs with held-out evaluations of the
student alone, summed up in results.json, a markdown table and plots. `python -m lopd_ray.study SPEC.yaml`."""
