"""ColossalAI's `colossalai.tensor.d_tensor` path; see api.py."""
