"""What `python -m lopd_ray.report` writes: the summary table, PNG curves and the HTML page of a run."""
