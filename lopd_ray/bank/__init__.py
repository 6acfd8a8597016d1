"""LOPD's experience bank (METHOD 2.1): successful traces, embedded and retrieved by task similarity."""
from lopd_ray.bank.bank import ExperienceBank, FrozenBankError, flat_ip_index
from lopd_ray.bank.embedder import Embedder, default_embedder_path
from lopd_ray.bank.traces import (BankEntry, composer_input_text, document_text, entries_from_successes,
                                  entry_from_trajectory, observation_lite_trace)

__all__ = ["BankEntry", "Embedder", "ExperienceBank", "FrozenBankError", "composer_input_text",
           "default_embedder_path", "document_text", "entries_from_successes", "entry_from_trajectory", "flat_ip_index",
           "observation_lite_trace"]
