"""Constrained decoding: grammars (JSON schema, tool-call syntax) compiled by llguidance,
and the per-request constraint the sampler applies token by token."""
