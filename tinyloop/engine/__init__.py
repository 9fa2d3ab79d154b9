"""The engine: requests, per-request decoding state, sampling, speculative decoding, the engine thread."""
