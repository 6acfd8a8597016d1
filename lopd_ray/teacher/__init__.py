"""LOPD's teacher side: the composer phi (LoRA encoder + Perceiver resampler) and latent injection.

`injection` needs only torch; `composer` imports peft, so import it where the composer is used."""
