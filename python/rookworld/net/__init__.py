"""The network: the GPT-2 port, its tokenizer, sampling, log-prob passes, and where its weights come from.
Imports `chess` and `settings` only."""
