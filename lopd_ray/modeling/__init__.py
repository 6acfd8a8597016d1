"""Model code the actors share, below all of them: token log-probs from hidden states (the learner's and the
teacher's), a shared prompt run once for its samples, the DeepSpeed train engine and the student's LoRA, weights
serialized with checksums and broadcast over a collective channel (learners send; rollout workers and following
teachers receive)."""
