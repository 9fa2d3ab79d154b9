"""The KV cache: modes and their settings, the per-request cache, the pool it is carved from."""
