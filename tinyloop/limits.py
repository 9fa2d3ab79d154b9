"""Limits shared by the engine, the KV cache and the HTTP layer (one place, so the field
limits the API validates and the row counts the cache plans for cannot drift apart)."""

MAX_DRAFT_AHEAD = 16                       # draft tokens per speculative round (chain depth)
MAX_BRANCHES = 16                          # K_branches: candidates kept per tree level
MAX_TREE_NODES = 64                        # K_branches * draft_ahead: drafted nodes per round
MAX_FORWARD_ROWS = MAX_TREE_NODES + 1      # rows one exact forward writes: the root and its nodes
ATTENTION_BLOCK = 64                       # keys are reduced in fixed blocks of this many positions
# Prompt rows one prefill forward takes (TINYLOOP_PREFILL_CHUNK): chunks are cut at its
# multiples (absolute positions), so a long prompt shares the engine's steps with other
# requests' decode steps, a step at a time (engine/decode.py, engine/engine.py). The engine
# takes its backend's `default_prefill_chunk` where it has one (the CPU's: 32); this is the
# others' default and the command line's.
DEFAULT_PREFILL_CHUNK = 128
