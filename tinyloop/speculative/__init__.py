"""Self-speculative decoding: draft with few loops, verify with many (chains and trees)."""
from .decoder import SpeculativeDecoder, speculative_generate
from .params import SpeculativeParams, SpeculativeStats

__all__ = ["SpeculativeDecoder", "SpeculativeParams", "SpeculativeStats", "speculative_generate"]
