"""The decoder: its schema (`ModelConfig`), the NNX module and its KV cache."""
