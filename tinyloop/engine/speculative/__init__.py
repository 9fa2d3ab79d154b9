"""Self-speculative decoding: draft with few loops, verify with many (chains and trees)."""
from tinyloop.engine.speculative.params import SpeculativeParams, SpeculativeStats

__all__ = ["SpeculativeParams", "SpeculativeStats"]
