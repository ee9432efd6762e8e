"""megalith.train: the `megalith train` job (a GPT on built-in text, any plugin, resumable)."""
