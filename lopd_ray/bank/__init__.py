"""LOPD's experience bank (METHOD 2.1): successful traces, embedded and retrieved by task similarity.

faiss and sentence-transformers load only when an `ExperienceBank` is built (lopd_ray.bank.bank)."""
