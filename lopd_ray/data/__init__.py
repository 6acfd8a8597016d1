from lopd_ray.data.trajectory import Trajectory

__all__ = ["Trajectory"]
