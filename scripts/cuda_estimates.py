"""Paper estimates for the CUDA kernels, to be checked by the first GPU run.

    python scripts/cuda_estimates.py              # print the tables
    python scripts/cuda_estimates.py --write      # also replace the estimates section of cuda/README.md

Per kernel and call of one decode step (batch 1, fp16 KV cache, 1,024 tokens of context):
bytes read and written (by the layouts of cuda/README.md), the time those bytes take at
the H200's 4.8 TB/s, and launches per decoded token; per kernel the occupancy the ptxas
figures of cuda/RESOURCES.md allow on an H200 SM (65,536 registers, 228 KiB shared
memory, 64 warps, 32 blocks) at the launcher's block size. Memory time is a lower bound:
a kernel of a few KiB is bound by its launch (~2-4 us from Python, ~1 us in a graph).

Then the latency-aware model (below, "the latency-aware model"): per kernel the bytes a warp
keeps in flight per round trip and the instructions its hot loop issues per byte, from the
machine code (cuda/SASS.md, written by scripts/sass_loops.py), give the share of 4.8 TB/s it
can reach; plus a gap per launch. Regenerate SASS.md (needs nvcc and nvdisasm) after a kernel
change, then this script with --write.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import sass_loops  # noqa: E402  (scripts/sass_loops.py)

from tinyloop.backends.cuda.launch import attention as attention_launch  # noqa: E402
from tinyloop.backends.cuda.launch import linear as linear_launch  # noqa: E402
from tinyloop.kv.modes import packed_bytes_per_row  # noqa: E402
HBM = 4.8e12
CONTEXT = 1024
LONG_CONTEXT = 4096                    # issue 27's attention target: at most 20 % of a step here
ATTENTION_SHARE_TARGET = 0.20
CHUNK_KEYS = 64 * attention_launch.CHUNK_BLOCKS      # keys a pass-1 attention block sums (cuda/attention.cu)

SHAPES = {
    # SmolLM2-135M-Instruct as pulled: Q4_1 core weights (int4, group 32), Q8_0 tied embedding/head
    "SmolLM2-135M": dict(dim=576, heads=9, kv=3, hd=64, ffn=1536, mlp="swiglu", instances=30, vocab=49152,
                         core_bits=4, head_bits=8, bias=False),
    # doc-407m at 8 loops: 1 prelude + 4 core x 8 + 1 coda = 34 layer instances, int4 group 32
    "doc-407m (8 loops)": dict(dim=2048, heads=16, kv=16, hd=128, ffn=8192, mlp="gelu", instances=34, vocab=50257,
                               core_bits=4, head_bits=4, bias=True),
}
BLOCK_THREADS = {"linear_rows": 256, "linear_bulk": 256, "kv_write": 128, "attention_merge": 128, "attention": 128,
                 "rms_norm": 256, "layer_norm": 256, "rope_rows": 256,
                 "swiglu": 256, "gelu_tanh": 256, "embed_rows": 256, "argmax_rows": 256,
                 "linear_tc": 256, "mma_16816_lanes": 32, "linear_mma": 128}


def packed_linear_bytes(n_in: int, n_out: int, bits: int, bias: bool) -> int:
    """Codes + f16 scale and min per group of 32 (as GGUF and RTN store them) + activations in
    + outputs out (+ bias)."""
    return n_out * n_in * bits // 8 + n_out * (n_in // 32) * 4 + n_in * 4 + n_out * 4 + (n_out * 4 if bias else 0)


QKV_FOLDED = "linear_rows qkv (+ the KV write, RoPE of the keys)"
DOWN_SWIGLU = "linear_rows down (+ SwiGLU, residual)"
# The out projection and the up projection after it in one launch (linear_pair.cu linear_rows_pair_int4:
# the up blocks wait for the out blocks' count): the up row launches nothing of its own.
OUT_PAIRED = "linear_rows_pair out (+ residual)"
UP_PAIRED = "linear_rows_pair up, after out's blocks (no launch)"
UP_PAIRED_GELU = "linear_rows_pair up (+ GELU), after out's blocks (no launch)"
IN_ANOTHER_LAUNCH = (UP_PAIRED, UP_PAIRED_GELU)
# The rows calls that stage norm(h) when the norm is fused (step_rows' fused_norm): qkv, up, the head.
NORMED_ROWS = (QKV_FOLDED, "linear_rows qkv", "linear_rows up", "linear_rows up (+ GELU)", UP_PAIRED, UP_PAIRED_GELU,
               "linear_rows head")


def launches(rows: list) -> int:
    """Launches a token of step_rows' (kernel, bytes, calls) or latency_rows' rows: every call
    but those that run in another kernel's launch (the pair's up projection)."""
    named = [(r["kernel"], r["calls"]) if isinstance(r, dict) else (r[0], r[2]) for r in rows]
    return sum(calls for name, calls in named if name not in IN_ANOTHER_LAUNCH)


# The attention kernel that reads each KV cache mode (launch/attention.py).
ATTENTION_KERNELS = {"fp16": "attention_fp16", "int8": "attention_int8", "int4": "attention_int4",
                     "int4-h": "attention_int4h", "fp32": "attention_fp32"}


def step_rows(s: dict, fused_norm: bool = True, context: int = CONTEXT, kv_mode: str = "fp16",
              paired: bool = False, kv_fold: bool | None = None,
              swiglu_fold: bool | None = None) -> list[tuple[str, int, int]]:
    """(kernel, bytes per call, calls per token) of one decode step at `context` tokens of a
    `kv_mode` cache. fused_norm (the default, and TINYLOOP_CUDA_MMA_ROWS's up to 4 rows): each
    pre-norm and the final norm ride on the linear after them (qkv, up, head), which read the
    residual row h instead of the norm's output. kv_fold (by default as fused_norm): the KV
    write rides on the qkv linear (the rows kernels' and linear_mma's); swiglu_fold (by default as
    kv_fold, off on the tensor-core rows): a SwiGLU on the down projection after it, which
    stages swiglu(up) from the up projection's 2 ffn outputs (the staging's exp and divide per
    input are not counted: about 6 a thread for SmolLM2's 1,536 inputs over a block's 256
    threads). paired (TINYLOOP_CUDA_PAIR=1; int4
    weights, the pair's kind, with the rows folds): the out projection and the up projection after
    it are one launch (OUT_PAIRED, then UP_PAIRED: the same bytes, no launch of its own)."""
    kv_fold = fused_norm if kv_fold is None else kv_fold
    swiglu_fold = kv_fold if swiglu_fold is None else swiglu_fold
    d, hd, q, kv, ffn, n = s["dim"], s["hd"], s["heads"] * s["hd"], s["kv"] * s["hd"], s["ffn"], s["instances"]
    up_out = 2 * ffn if s["mlp"] == "swiglu" else ffn
    norm = "rms_norm" if s["mlp"] == "swiglu" else "layer_norm"
    chunk_partials = s["heads"] * (hd + 2) * (context // CHUNK_KEYS) * 4       # written by pass 1, read by the merge
    stored_row = packed_bytes_per_row(kv_mode, s["kv"], hd)   # one token's keys and values as the cache holds them
    # RoPE is fused: the KV write rotates the keys (and writes them back), attention the
    # queries as it loads them; each reads the rotation row. The KV write itself rides on the
    # qkv linear where the norm does (the rows kernels: the warps that finish a head store it)
    kv_write = 2 * kv * 4 + stored_row + 4 + kv * 4 + hd * 4
    qkv = packed_linear_bytes(d, q + 2 * kv, s["core_bits"], s["bias"])
    paired = paired and swiglu_fold and s["core_bits"] == 4     # launch/linear.py PAIR_KERNELS
    rows = [
        ("embed_rows", 2 * d * 4, 1),
        *([] if fused_norm else [(norm, 3 * d * 4, 2 * n + 1)]),
        *([(QKV_FOLDED, qkv + kv_write, n)] if kv_fold else
          [("linear_rows qkv", qkv, n), ("kv_write_fp16 (+ RoPE of the keys)", kv_write, n)]),
        # CHUNK_KEYS-key chunks; the last chunk block of each kv head merges (partials written and read)
        (f"{ATTENTION_KERNELS[kv_mode]} (+ RoPE of the queries; {CHUNK_KEYS}-key chunks, merge folded in)",
         context * stored_row + q * 4 + 2 * chunk_partials + q * 4 + 4 + hd * 4, n),
        # the residual add is fused into the out and down projections' epilogue: h read there
        (OUT_PAIRED if paired else "linear_rows out (+ residual)",
         packed_linear_bytes(q, d, s["core_bits"], s["bias"]) + d * 4, n),
        # GELU is fused into the up projection's epilogue (one launch fewer); SwiGLU pairs two
        # columns that different warps compute, so it rides on the down projection's staging
        # instead (which then reads both: ffn floats more), or is a kernel of its own
        ((UP_PAIRED if s["mlp"] == "swiglu" else UP_PAIRED_GELU) if paired else
         "linear_rows up" + ("" if s["mlp"] == "swiglu" else " (+ GELU)"),
         packed_linear_bytes(d, up_out, s["core_bits"], s["bias"]), n),
        *([("swiglu", (up_out + ffn) * 4, n)] if s["mlp"] == "swiglu" and not swiglu_fold else []),
        *([(DOWN_SWIGLU, packed_linear_bytes(ffn, d, s["core_bits"], s["bias"]) + ffn * 4 + d * 4, n)]
          if s["mlp"] == "swiglu" and swiglu_fold else
          [("linear_rows down (+ residual)", packed_linear_bytes(ffn, d, s["core_bits"], s["bias"]) + d * 4, n)]),
        ("linear_rows head", packed_linear_bytes(d, s["vocab"], s["head_bits"], False), 1),
        ("argmax_rows", s["vocab"] * 4 + 4, 1),
    ]
    return rows


def resources() -> dict:
    """{kernel: (registers, static smem)} for sm_90 from cuda/RESOURCES.md."""
    path = ROOT / "cuda" / "RESOURCES.md"
    out = {}
    if path.exists():
        for m in re.finditer(r"\| \S+ \| `(\w+)` \| sm_90 \| (\d+) \| (\d+) \|", path.read_text()):
            out[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return out


def occupancy(registers: int, smem: int, threads: int) -> float:
    """Resident warps per SM / 64 on an H200 (registers allocated per warp in 256s)."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = 65536 // (per_warp * warps)
    by_smem = (228 * 1024) // (smem + 1024) if smem else 32
    blocks = min(32, by_registers, by_smem, 64 // warps)
    return blocks * warps / 64


# -- the latency-aware model --------------------------------------------------------------------
# A bandwidth-bound kernel reaches 4.8 TB/s only if each SM keeps BW_SM x LATENCY bytes in
# flight (Little's law): 36 GB/s per SM x ~600 ns = ~22 KB. A warp's bytes in flight are
# what it loads in one round (the loads it issues before it must wait for one of them,
# counted in the SASS by scripts/sass_loops.py); an SM holds its resident warps' rounds,
# or fewer when the launch has fewer warps than the GPU holds. And a warp issues at most
# one instruction per cycle per scheduler (4 per SM): the instructions a loop issues per
# byte it loads bound the rate too. expected fraction of 4.8 TB/s = min(1, latency bound,
# issue bound); a launch inside a graph adds LAUNCH_GAP_S on top (the drain of one kernel
# and the start of the next). LATENCY_S and LAUNCH_GAP_S are assumptions from public Hopper
# measurements, not ours: scripts/bench_gpu.py's per-kernel table is what calibrates them.
SMS = 132
SM_CLOCK_HZ = 1.98e9
ISSUE_PER_SM = 4                       # warp instructions per cycle: 4 schedulers
LATENCY_S = 600e-9                     # one dependent round trip to HBM3 under load
L2_LATENCY_S = 300e-9                  # one that hits L2 (partials a launch just wrote)
LAUNCH_GAP_S = 1.0e-6                  # per kernel inside a CUDA graph
# With programmatic dependent launch (TINYLOOP_CUDA_PDL=1) the next grid's blocks are already on
# the SMs, waiting in griddepcontrol.wait, when the previous grid ends: what is left of a boundary
# is that grid's completion becoming visible, taken here as about an L2 round trip. An
# assumption, to be replaced by scripts/bench_gpu.py's dependent_launch figure.
PDL_GAP_S = 0.3e-6
BW_SM = HBM / SMS


@dataclass
class LoopFigures:
    """One warp's iteration of a kernel's hot loop (cuda/SASS.md)."""
    instructions: int
    bytes_per_lane: int
    rounds: int

    @property
    def bytes_per_round(self) -> float:        # per warp
        return 32 * self.bytes_per_lane / max(self.rounds, 1)


def hot_loop(kernel: str, rows: int = 1, sass: dict | None = None) -> LoopFigures | None:
    """The loop a kernel streams its bytes in, from cuda/SASS.md: for linear_rows_*, the batch
    loop of the 4-row chunk (rows > 1) or the 1-row one; for attention_*, the tile loader's row loop (the outer of its tagged
    loops, which holds the inner once)."""
    kernels = (sass if sass is not None else sass_loops.read_saved()).get("kernels", {})
    loops = kernels.get(kernel, {}).get("loops", [])
    if not loops:
        return None
    if kernel.startswith("linear_rows"):
        # a chunk's batch loop (linear.cu): for one row, the resident loop (rows_resident, tagged)
        # in its even form (whole batches: one arm, the fewest instructions); for more rows, the
        # 4-row chunk's batch loop, the innermost loop (holding no other) that reads the most
        # staged inputs a weight chunk.
        # Either loads the next batch while it sums this one: one batch a warp in flight, one
        # round an iteration.
        cpw = linear_launch.COLUMNS_PER_WORD.get(kernel.split("_")[2], 8)
        innermost = [l for l in loops
                     if not any(o is not l and l["start"] <= o["start"] and o["end"] <= l["end"] for o in loops)]
        # one row's loop: the fewest float operations a word (a second row adds its product and
        # sum to each weight's decoding; how many the decoding takes depends on the kind)
        resident = [l for l in innermost if "linear-rows-resident" in l["tags"] and l["widths"].get("16", 0)]
        if resident:
            fewest = min(l["float_ops"] / l["widths"]["16"] for l in resident)
            resident = [l for l in resident if l["float_ops"] / l["widths"]["16"] == fewest]
        tiled = [l for l in innermost if "linear-rows-resident" not in l["tags"]]
        if rows == 1 and resident:
            loop = min(resident, key=lambda l: l["instructions"])
        else:
            # the 4-row chunk's: the most shared loads (a row's inputs) a 16-byte weight load
            loop = max(tiled or loops, key=lambda l: l["shared_loads"] / max(l["widths"].get("16", 0), 1))
        # from DRAM: each word (a lane's chunk of 4 words: one 16-byte load, the loop's only one)
        # and its share of a group's half scale and min, which a lane loads once a chunk (groups
        # of 32 columns, as step_rows counts them)
        words = 4 * loop["widths"].get("16", 0)
        params = words * 4 * cpw / 32 if "_int" in kernel else 0
        return LoopFigures(loop["instructions"], words * 4 + params, 1)
    elif staged := [l for l in loops if "attention-stage" in l["tags"]]:
        loop = min(staged, key=lambda l: l["rounds"])          # a decode's blocks, not a tree's tail
    else:
        # the element loader's row loop (not the sums' loops, tagged too)
        tiles = [l for l in loops if "attention-tile" in l["tags"]] or loops
        loop = max(tiles, key=lambda l: l["instructions"])
    return LoopFigures(loop["instructions"], loop["load_bytes_per_lane"] + loop["async_bytes_per_lane"],
                       loop["rounds"])


# attention.cu's value sums: a 64-key block's tree over the 4 value columns a thread takes
# (16-byte loads where hd is a multiple of 4) runs as 64 / leaves trees of `leaves` keys in
# nested loops of two halves (att_tree64): 4 keys for the int4 caches' kernels, 8 for the others
# (AttTreeLeaves, read from its source line)
_LEAVES = re.search(r"static constexpr int value = MODE == ATT_INT4 \? (\d+) : (\d+);",
                    (ROOT / "cuda" / "attention.cu").read_text())
if _LEAVES is None:
    raise RuntimeError("cuda/attention.cu: AttTreeLeaves' line (value = MODE == ATT_INT4 ? a : b;) not found")


def att_tree_leaves(kernel: str) -> int:
    """The keys of attention.cu's innermost value tree in `kernel` (attention_int4 and
    attention_int4h take ATT_INT4)."""
    return int(_LEAVES.group(1) if kernel in ("attention_int4", "attention_int4h") else _LEAVES.group(2))


ATT_VALUE_COLUMNS = 4
# the arithmetic alone (a multiply and an add for a score's element, and again for a value's):
# the figure where the machine code has no tagged loops for the sums
ATT_SUM_ARITHMETIC = 4


def attention_sum_instructions(kernel: str, sass: dict | None = None) -> float:
    """Warp instructions a thread issues per (query, head, key, d) element of attention's sums,
    from the machine code: the scores' dot product (the innermost tagged attention-scores loop
    with the most float operations: its unrolled body, a multiply and an add an element) plus
    the value sums, att_quad_sums' unmasked tree of the blocks a query sees whole: the cheapest
    innermost tagged attention-values loop (a tree of att_tree_leaves(kernel) keys) and the
    levels - 1 attention-values-join loops around it (64 / leaves = 2^levels trees), each a
    loop of two halves, so a 64-key block runs level k (0 the outermost) 2^(k+1) times its own
    instructions (less the loop inside). The masked tree of a query's last block and each score's and task's index
    arithmetic, under 4 % of a 1k-context sum, are not counted. Every model here has hd a
    multiple of 4; a head size that is not (the sums a column at a time, masked) would cost
    more than this."""
    kernels = (sass if sass is not None else sass_loops.read_saved()).get("kernels", {})
    loops = kernels.get(kernel, {}).get("loops", [])

    def inside(inner, outer):
        return inner is not outer and outer["start"] <= inner["start"] and inner["end"] <= outer["end"]
    scores = [l for l in loops if l["tags"] == ["attention-scores"] and l["float_ops"]
              and not any(inside(o, l) for o in loops)]
    trees = [l for l in loops if "attention-values" in l["tags"] and not any(inside(o, l) for o in loops)]
    if not scores or not trees:
        return ATT_SUM_ARITHMETIC
    dot = max(scores, key=lambda l: l["float_ops"])
    tree = min(trees, key=lambda l: l["instructions"])
    leaves = att_tree_leaves(kernel)
    levels = (64 // leaves).bit_length() - 1
    joins = sorted((l for l in loops if "attention-values-join" in l["tags"] and inside(tree, l)),
                   key=lambda l: l["end"] - l["start"])[:levels - 1]
    if len(joins) < levels - 1:
        raise ValueError(f"{kernel}: {len(joins)} attention-values-join loops around the tree, "
                         f"not the {levels - 1} of {64 // leaves} trees")
    chain = joins[::-1] + [tree]                                  # outermost first
    # each level adds its two halves, one add a lane more than the level inside it: a loop
    # around the chain that carries the tag (a task loop) or an unrolled level shows here
    for outer, inner in zip(chain, chain[1:]):
        if outer.get("float_ops", 0) - inner.get("float_ops", 0) != ATT_VALUE_COLUMNS:
            raise ValueError(f"{kernel}: the values loop at {outer['start']} adds {outer.get('float_ops', 0)} "
                             f"float operations around {inner.get('float_ops', 0)}: not a level of two halves")
    issued = sum(2 ** (k + 1) * (level["instructions"] - (chain[k + 1]["instructions"] if k + 1 < len(chain) else 0))
                 for k, level in enumerate(chain))
    return dot["instructions"] / (dot["float_ops"] / 2) + issued / (64 * ATT_VALUE_COLUMNS)


class EdgeStaging(NamedTuple):
    passes: int          # the edge loop's passes a thread makes
    items: int           # the edge items (8 columns each) of a row, over the block's parts and batches


def mma_edge_staging(n_in: int, n_out: int, rows: int) -> EdgeStaging:
    """The edge loop of the busiest block of a linear_mma call (linear_mma.cu
    mma_stage_edge_items, in every batch the block stages: for each of its parts, the items of 8
    columns with a column past in_features, a (row, item) a thread a pass over the block's
    threads; the whole-items loop skips them), the weight's stored columns taken as n_in.
    (0, 0) where in_features fills every part's items."""
    L = linear_launch
    split_k = L.mma_split_k(n_in, n_out)
    splits = -(-n_in // split_k)
    parts = L.mma_parts(splits, rows)
    tile_rows = min(rows, L.MMA_TILE_ROWS)
    worst = EdgeStaging(0, 0)
    for first_split in range(0, splits, parts):
        block_parts = min(parts, splits - first_split)
        lead_chunks = -(-min(split_k, n_in - first_split * split_k) // L.MMA_CHUNK)
        passes = items_past = 0
        for batch in range(-(-lead_chunks // L.MMA_MAX_CHUNKS)):
            kb = first_split * split_k + batch * L.MMA_MAX_CHUNKS * L.MMA_CHUNK
            items = min(lead_chunks - batch * L.MMA_MAX_CHUNKS, L.MMA_MAX_CHUNKS) * (L.MMA_CHUNK // 8)
            for p in range(block_parts):
                edge_items = max(0, items - max(0, (n_in - (kb + p * split_k)) // 8))
                passes += -(-tile_rows * edge_items // L.MMA_THREADS)
                items_past += edge_items
        worst = max(worst, EdgeStaging(passes, items_past))
    return worst


def mma_call(n_in: int, n_out: int, rows: int, sass: dict | None = None, norm: str | None = None) -> dict | None:
    """One linear_mma_int4 call (TINYLOOP_CUDA_MMA_ROWS), rows <= 16 a tile: -> {partials,
    detail, fraction, extra_s}, or None without its SASS figures. A warp's split runs in batches
    of 4 chunks, the next batch's weights loading while this one's products are summed: about
    two batches in flight, chunks x 2 x (16 + 2 + 2) bytes a lane in all. Its instructions are
    the batch loop's body in cuda/SASS.md less its staging loops (one batch of 4 chunks), scaled
    to the split's chunks, and the staging passes of the call's rows (16 items of 8 columns a
    chunk and a row, or a pair of rows in the whole-items loop, over 128 threads) for each of
    the block's parts (launch/linear.py mma_parts: the splits a block's warps take, at an H200's
    shared memory). Splits a block holds all add in shared memory (no round trip); splits across
    blocks (past 16 rows) write their partials, read back, and the last block's sum adds its
    tail: the counter's round trip, then one per split (from L2).
    norm ("rms" or "layer": the pre-norm folded in): the batch loop and staging pass of the
    normed path (tagged linear-mma-norm), and the statistics before the first batch: each warp
    takes every fourth row of the tile, a round trip (from L2) per pass over the row (one for
    RMS, two for layer norm) and per 2,048 elements, of which the first batch's weight loads,
    issued before them, hide one DRAM round trip."""
    kernels = (sass if sass is not None else sass_loops.read_saved()).get("kernels", {})
    loops = kernels.get("linear_mma_int4", {}).get("loops", [])
    # the batch loop's body (the next batch's loads, a staging pass, the products); before the
    # loop, the first batch's loads and the run to the last mma count the same work again
    # the normed path's loops carry its staging's tag, the plain path's do not
    normed = (lambda l: "linear-mma-norm" in l["tags"]) if norm else (lambda l: "linear-mma-norm" not in l["tags"])
    batch_loops = [l for l in loops if "linear-mma-weights" in l["tags"] and normed(l)]
    if not batch_loops:
        return None
    body = min(batch_loops, key=lambda l: l["instructions"])
    split_k = linear_launch.mma_split_k(n_in, n_out)
    chunks, splits = split_k // linear_launch.MMA_CHUNK, -(-n_in // split_k)
    parts = linear_launch.mma_parts(splits, rows)
    y_blocks = -(-splits // parts)
    batches = -(-chunks // linear_launch.MMA_MAX_CHUNKS)
    # The staging loop a batch runs (mma_stage_batch): with the pre-norm, the normed one (a row of
    # an item a pass); without, the whole-items loop (16-byte loads, rows r and r + 8 of an item
    # a pass; x float with its rows 16-byte aligned, as the backend's buffers are: the checked
    # loop takes misaligned ones), over the block's parts with columns (3 of 4 for 3 splits;
    # the checked loop stages all 4), and its edge loop (the items with a column past
    # in_features, a row a pass, which the whole-items loop skips: mma_edge_staging; none for
    # doc-407m's widths, 3 passes at 16 rows for SmolLM2's 576 inputs, 24 of the last part's 32
    # items). The batch loop's body holds
    # every staging loop once: the products are the body less those, and the staging its passes
    # of the loops it runs.
    staging_tags = (["linear-mma-norm"],) if norm else (["linear-mma-stage"], ["linear-mma-stage-checked"],
                                                        ["linear-mma-stage-edge"])
    nested = [l for l in loops if l["tags"] in staging_tags and body["start"] <= l["start"] and l["end"] <= body["end"]]
    two_rows = not norm                  # the whole-items loop's pairs of rows
    stage = [l for l in loops if l["tags"] == (["linear-mma-stage"] if two_rows else staging_tags[0])]
    stage_pass = min(l["instructions"] for l in stage) if stage else 0
    # a chunk's staging is 16 items (8 columns each) for each row of the call's tile (each pair
    # of rows r, r + 8 in the whole-items loop) and each of the block's parts, over the block's
    # 128 threads: two passes a chunk for a full tile of 16 rows (one in the whole-items loop),
    # an eighth for one row, times the parts
    tile_rows = min(rows, linear_launch.MMA_TILE_ROWS)
    passes_rows = min(tile_rows, linear_launch.MMA_TILE_ROWS // 2) if two_rows else tile_rows
    staged_parts = min(parts, splits) if two_rows else parts
    edge_pass = min((l["instructions"] for l in loops if l["tags"] == ["linear-mma-stage-edge"]), default=0)
    edges = mma_edge_staging(n_in, n_out, rows) if two_rows else EdgeStaging(0, 0)
    whole_items = chunks * (linear_launch.MMA_CHUNK // 8) * staged_parts - edges.items
    instructions = ((body["instructions"] - sum(l["instructions"] for l in nested)) * chunks
                    / linear_launch.MMA_MAX_CHUNKS
                    + stage_pass * passes_rows * whole_items / linear_launch.MMA_THREADS
                    + edge_pass * edges.passes)
    loop = LoopFigures(round(instructions), chunks * 2 * (16 + 2 + 2), max(1, -(-batches // 2)))
    tiles = -(-rows // linear_launch.MMA_TILE_ROWS)
    # the warps with a split (3 splits on 4 parts leave a warp of each block idle), and of an
    # SM's resident warps (the staging buffers, 2 x 16.1 KiB a part, bound the blocks) as many
    warps = -(-n_out // 16) * splits * tiles
    busy = splits / (parts * y_blocks)
    resident = resident_warps("linear_mma_int4", linear_launch.MMA_THREADS, linear_launch.mma_shared_bytes(parts))
    detail = expected_fraction(loop, max(1, round(resident * busy)), warps)
    partials = 2 * splits * rows * n_out * 4 if y_blocks > 1 else 0
    stats_s = 0.0
    if norm:
        warp_rows = -(-min(rows, linear_launch.MMA_TILE_ROWS) // (linear_launch.MMA_THREADS // 32))
        trips = warp_rows * (1 if norm == "rms" else 2) * -(-n_in // 2048)
        stats_s = max(0.0, trips * L2_LATENCY_S - LATENCY_S)
    # the last block: its counter's atomic, then a split's partial a round trip (L2); splits a
    # block holds all are added from shared memory after a barrier: no round trip, not counted
    return {"partials": partials, "detail": {**detail, "splits": splits, "parts": parts}, "fraction": detail["fraction"],
            "extra_s": (LATENCY_S + splits * L2_LATENCY_S if y_blocks > 1 else 0.0) + stats_s}


def rows_chunks(rows: int) -> list[int]:
    """The row chunks a rows call runs one after another (linear_rows.cuh linear_rows_of):
    LIN_CHUNK rows while as many are left, then 2, then 1."""
    chunk = rows_chunk()
    out = [chunk] * (rows // chunk)
    rest = rows % chunk
    return out + ([2] if rest >= 2 else []) + ([1] if rest % 2 else [])


def rows_norm_stats_s(s: dict, rows: int, n_in: int, cpw: int = 8) -> float:
    """The fused pre-norm's statistics in a rows call (linear_rows.cuh rows_norm_stats): each
    chunk (rows_chunks) finds its rows' statistics, a warp a row, all at once: a round trip
    (from L2) per pass over the row (one for RMS, two for layer norm) and per 2,048 elements.
    A chunk of 1 or 2 rows on the resident path (its words fit a tile: rows_chunk) issues its
    first batch of weights before them, which hides one DRAM round trip; a tiled chunk finds
    them before its loads. cpw: the weight's columns a 32-bit word."""
    trips = (1 if s["mlp"] == "swiglu" else 2) * -(-n_in // 2048)
    total = 0.0
    for r in rows_chunks(rows):
        resident = r <= 2 and n_in / cpw <= linear_launch.rows_tile_words(cpw, r)
        total += max(0.0, trips * L2_LATENCY_S - LATENCY_S) if resident else trips * L2_LATENCY_S
    return total


def rows_chunk() -> int:
    """Rows a rows kernel sums at once (cuda/linear_rows.cuh LIN_CHUNK): each chunk reads the weights."""
    m = re.search(r"#define LIN_CHUNK (\d+)", (ROOT / "cuda" / "linear_rows.cuh").read_text())
    return int(m.group(1))


def queries_share_blocks() -> bool:
    """Whether a pass-1 block serves several queries (attention.cu's att_block_step: a verify's
    queries read each block of keys and values once)."""
    return "att_block_step" in (ROOT / "cuda" / "attention.cu").read_text()


def merge_tail_s(n_chunks: int, sass: dict | None = None) -> float:
    """The fused merge at the end of an attention launch: the last chunk block's counter (a
    round trip), then its merge loop over the query's chunks, ATT_MERGE_BATCH chunks an
    iteration at that loop's rounds (cuda/SASS.md "attention-merge"), from L2."""
    kernels = (sass if sass is not None else sass_loops.read_saved()).get("kernels", {})
    merge = [l for l in kernels.get("attention_fp16", {}).get("loops", []) if "attention-merge" in l["tags"]]
    m = re.search(r"#define ATT_MERGE_BATCH (\d+)", (ROOT / "cuda" / "attention.cu").read_text())
    batch = int(m.group(1)) if m else 1
    rounds = min(l["rounds"] for l in merge) if merge else 2
    return LATENCY_S + -(-n_chunks // batch) * rounds * L2_LATENCY_S


def expected_fraction(loop: LoopFigures, resident_warps: int, launched_warps: int) -> dict:
    """-> {in_flight (bytes per SM), latency, issue, fraction} for a kernel streaming with `loop`."""
    warps_per_sm = min(resident_warps, max(launched_warps / SMS, 1e-9))
    in_flight = warps_per_sm * loop.bytes_per_round
    latency = in_flight / (BW_SM * LATENCY_S)
    issue = ISSUE_PER_SM * SM_CLOCK_HZ * 32 * loop.bytes_per_lane / loop.instructions / BW_SM
    return {"in_flight": in_flight, "latency": latency, "issue": issue, "fraction": min(1.0, latency, issue)}


def resident_warps(kernel: str, threads: int, dynamic_smem: int = 0) -> int:
    registers, smem = resources().get(kernel, (64, 0))
    return round(occupancy(registers, smem + dynamic_smem, threads) * 64)


def attention_shared(s: dict, sass: dict | None) -> int:
    """Pass 1's dynamic shared memory for one query (launch/attention.py shared_bytes): two tiles
    (keys and values together) where the SASS has the 16-byte stager, one before it."""
    kernels = (sass if sass is not None else sass_loops.read_saved()).get("kernels", {})
    staged = any("attention-stage" in l["tags"] for l in kernels.get("attention_fp16", {}).get("loops", []))
    return attention_launch.shared_bytes(s["heads"] // s["kv"], s["hd"], 1, 2 if staged else 1)


def latency_rows(s: dict, sass: dict | None = None, rows: int = 1, mma: bool = False,
                 requests: bool = False, gap_s: float = LAUNCH_GAP_S, context: int = CONTEXT,
                 kv_mode: str = "fp16", paired: bool = False) -> list[dict]:
    """The decode step's kernels with the latency-aware time: bytes / (4.8 TB/s x fraction) +
    the launch gap. Kernels without a tagged loop (norms, RoPE, the KV write, the merge,
    argmax: a few KiB each) count at full bandwidth: their launch is their cost (the KV write's
    plus the round trip of its load; folded into the qkv linear, two round trips at its end).

    rows = 16: the same step for a 16-row verify. The linear runs four 4-row chunks (LIN_CHUNK),
    each with the 4-row loop's figures and each reading the weights (the later ones from L2,
    counted at HBM's rate); attention runs 16 queries' blocks, each reading its keys and values (from L2
    after the first, counted likewise): both pessimistic where L2 serves faster than HBM.

    mma: the int4 linears on linear_mma_int4 (mma_call): 1-16 rows read the weights once.
    requests: the rows are `rows` requests' decode steps, each at `context` tokens of its own cache
    (a batch graph, backends/cuda/batch.py): attention reads every row's keys and values, one
    query a block. kv_mode: the cache's mode, read by its own attention kernel (its own hot loop).
    paired: the out and up projections as one launch (step_rows): the up projection pays no launch
    gap but the handoff inside the launch, two round trips (the out blocks' fence and count, then
    the waiting block's read that sees it) before its own first load."""
    d, q, kv, ffn = s["dim"], s["heads"] * s["hd"], s["kv"] * s["hd"], s["ffn"]
    up_out = 2 * ffn if s["mlp"] == "swiglu" else ffn
    kind = f"int{s['core_bits']}"
    linear_warps = {"linear_rows qkv": q + 2 * kv, QKV_FOLDED: q + 2 * kv, "linear_rows out (+ residual)": d,
                    OUT_PAIRED: d, "linear_rows up": up_out, UP_PAIRED: up_out, UP_PAIRED_GELU: up_out,
                    "linear_rows up (+ GELU)": up_out, "linear_rows down (+ residual)": d, DOWN_SWIGLU: d,
                    "linear_rows head": s["vocab"]}
    linear_in = {"linear_rows qkv": d, QKV_FOLDED: d, "linear_rows out (+ residual)": q, OUT_PAIRED: q,
                 "linear_rows up": d, UP_PAIRED: d, UP_PAIRED_GELU: d,
                 "linear_rows up (+ GELU)": d, "linear_rows down (+ residual)": ffn, DOWN_SWIGLU: ffn,
                 "linear_rows head": d}
    out = []
    # linear_mma folds the pre-norm into calls of up to MMA_NORM_FOLD_MAX_ROWS rows (the backend)
    norm_folded = not mma or rows <= linear_launch.MMA_NORM_FOLD_MAX_ROWS
    # the KV write rides on the qkv call on either path, the SwiGLU only on the rows kernels'
    for name, nbytes, calls in step_rows(s, fused_norm=norm_folded, context=context, kv_mode=kv_mode, paired=paired,
                                         kv_fold=True, swiglu_fold=not mma):
        fraction, detail, extra_s, gap = 1.0, None, 0.0, gap_s
        bits = s["head_bits"] if name.endswith("head") else s["core_bits"]
        # the pre-norm rides on qkv, up and the head (fused_norm): linear_mma stages it too
        takes_norm = norm_folded and name in NORMED_ROWS
        call = mma_call(linear_in[name], linear_warps[name], rows, sass,
                        ("rms" if s["mlp"] == "swiglu" else "layer") if takes_norm else None) \
            if mma and name in linear_warps and bits == 4 else None
        # the folded KV write's tail, on either kernel: the fence and count after the last
        # columns (an atomic's round trip), then the completing warp's load of the row (another)
        kv_tail_s = 2 * LATENCY_S if name == QKV_FOLDED else 0.0
        if call:
            detail, extra_s = call["detail"], call["extra_s"] + kv_tail_s
            name = name.replace("linear_rows", "linear_mma")
            nbytes += call["partials"] + (rows - 1) * (linear_in[name.replace("linear_mma", "linear_rows")]
                                                       + linear_warps[name.replace("linear_mma", "linear_rows")]) * 4
        elif name in linear_warps:
            kernel = f"linear_rows_int{s['head_bits']}" if name.endswith("head") else f"linear_rows_{kind}"
            loop = hot_loop(kernel, rows, sass)
            # the pair runs the same rows code at its own occupancy (its registers: one block an SM)
            resident = resident_warps("linear_rows_pair_int4" if name.startswith("linear_rows_pair") else kernel, 256)
            if loop:
                detail = expected_fraction(loop, resident, linear_warps[name])
            nbytes *= -(-rows // rows_chunk())                        # one read per row chunk
            extra_s = kv_tail_s
            if norm_folded and name in NORMED_ROWS:
                extra_s += rows_norm_stats_s(s, rows, linear_in[name], 32 // bits)
            if name in IN_ANOTHER_LAUNCH:
                # no launch gap: the handoff instead, the out blocks' fence and count (a round
                # trip), then the waiting block's read that sees the count (another)
                extra_s, gap = extra_s + 2 * LATENCY_S, 0.0
        elif name.startswith("attention_"):
            kernel = name.split()[0]
            loop = hot_loop(kernel, 1, sass)
            shares = queries_share_blocks() and not requests
            blocks_launched = s["kv"] * (context // CHUNK_KEYS) * (1 if shares else rows)
            if loop:
                detail = expected_fraction(loop, resident_warps(kernel, 128, attention_shared(s, sass)),
                                           blocks_launched * 4)
            nbytes *= 1 if shares else rows
            # the sums: per (query, head, key, d) the instructions a thread issues for its
            # score's element and its value's (attention_sum_instructions, from the machine
            # code), 32 threads a warp instruction; over the SMs the launch's blocks occupy
            sums = rows * s["heads"] * context * s["hd"] * attention_sum_instructions(kernel, sass) / 32
            issue_s = sums / (ISSUE_PER_SM * SM_CLOCK_HZ * min(SMS, blocks_launched))
            if detail and issue_s > nbytes / (HBM * detail["fraction"]):
                detail = {**detail, "fraction": nbytes / (HBM * issue_s), "bound": "sums"}
            extra_s = merge_tail_s(context // CHUNK_KEYS, sass)
        elif name != "linear_rows head" and name != "argmax_rows":
            nbytes *= rows                                            # per-row activations
            if name.startswith("kv_write"):
                extra_s = LATENCY_S                                   # its load of the row, before the store
        if detail:
            fraction = detail["fraction"]
        seconds = nbytes / (HBM * fraction) + gap + extra_s
        out.append({"kernel": name, "bytes": nbytes, "calls": calls, "fraction": fraction, "detail": detail,
                    "us": seconds * 1e6})
    return out


def latency_table(sass: dict | None = None) -> str:
    lines = [f"Latency-aware, the same step: a round trip {LATENCY_S * 1e9:.0f} ns, {LAUNCH_GAP_S * 1e6:.1f} us "
             f"per launch in a graph, {SMS} SMs issuing {ISSUE_PER_SM} warp instructions per cycle at "
             f"{SM_CLOCK_HZ / 1e9:.2f} GHz; hot loops from cuda/SASS.md.", ""]
    for name, shape in SHAPES.items():
        rows = latency_rows(shape, sass)
        lines += [f"**{name}**", "", "| kernel | in flight / SM (B) | latency bound | issue bound | "
                  "expected share of 4.8 TB/s | us / call | us / token |", "|---|---|---|---|---|---|---|"]
        total = 0.0
        for r in rows:
            d = r["detail"]
            cells = (f"{d['in_flight']:,.0f} | {d['latency']:.0%} | {d['issue']:.0%}" if d else "- | - | -")
            lines.append(f"| {r['kernel']} | {cells} | {r['fraction']:.0%} | {r['us']:.2f} | {r['us'] * r['calls']:.1f} |")
            total += r["us"] * r["calls"]
        step_launches = launches(rows)
        verify = sum(r["us"] * r["calls"] for r in latency_rows(shape, sass, rows=16))
        lines += [f"| **step** | | | | | {step_launches} launches ({step_launches * LAUNCH_GAP_S * 1e6:.0f} us) | "
                  f"{total:.0f} ({1e6 / total:,.0f} tok/s) |", "",
                  f"The same step over 16 rows (a verify, `latency_rows(rows=16)`): {verify:,.0f} us, "
                  f"{verify / total:.2f}x the 1-row step (the target is 1.2x).", ""]
        pdl = sum(r["us"] * r["calls"] for r in latency_rows(shape, sass, gap_s=PDL_GAP_S))
        lines += [f"With programmatic dependent launch (`TINYLOOP_CUDA_PDL=1`), if a kernel boundary costs "
                  f"{PDL_GAP_S * 1e6:.1f} us instead of {LAUNCH_GAP_S * 1e6:.1f} (an assumption, `PDL_GAP_S`): "
                  f"a step {pdl:.0f} us ({1e6 / pdl:,.0f} tok/s).", ""]
        pair_rows = latency_rows(shape, sass, paired=True)
        if launches(pair_rows) < step_launches:
            pair = sum(r["us"] * r["calls"] for r in pair_rows)
            pair_pdl = sum(r["us"] * r["calls"] for r in latency_rows(shape, sass, gap_s=PDL_GAP_S, paired=True))
            lines += [f"With the out and up projections as one launch (`TINYLOOP_CUDA_PAIR=1`, "
                      f"`linear_rows_pair_int4`): {launches(pair_rows)} launches, a step {pair:.0f} us "
                      f"({1e6 / pair:,.0f} tok/s; {pair_pdl:.0f} us with `TINYLOOP_CUDA_PDL=1` too): the "
                      f"handoff inside the launch, {2 * LATENCY_S * 1e6:.1f} us (two round trips), against "
                      f"the launch gap it saves.", ""]
        mma_rows = latency_rows(shape, sass, mma=True)
        if any(r["kernel"].startswith("linear_mma") for r in mma_rows):
            mma_total = sum(r["us"] * r["calls"] for r in mma_rows)
            mma_verify = sum(r["us"] * r["calls"] for r in latency_rows(shape, sass, rows=16, mma=True))
            lines += [f"With `TINYLOOP_CUDA_MMA_ROWS=1` (the int4 linears on `linear_mma_int4`, `mma_call`):", "",
                      "| kernel | splits | in flight / SM (B) | latency bound | issue bound | expected share | "
                      "us / call | us / token |", "|---|---|---|---|---|---|---|---|"]
            for r in mma_rows:
                if r["kernel"].startswith("linear_mma"):
                    d = r["detail"]
                    lines.append(f"| {r['kernel']} | {d['splits']} | {d['in_flight']:,.0f} | {d['latency']:.0%} | "
                                 f"{d['issue']:.0%} | {r['fraction']:.0%} | {r['us']:.2f} | "
                                 f"{r['us'] * r['calls']:.1f} |")
            mma_pdl = sum(r["us"] * r["calls"] for r in latency_rows(shape, sass, mma=True, gap_s=PDL_GAP_S))
            lines += ["", f"Step {mma_total:.0f} us ({1e6 / mma_total:,.0f} tok/s), {launches(mma_rows)} launches; "
                      f"over 16 rows {mma_verify:,.0f} us, {mma_verify / mma_total:.2f}x the 1-row step. With "
                      f"`TINYLOOP_CUDA_PDL=1` too (the same {PDL_GAP_S * 1e6:.1f} us assumption): a step "
                      f"{mma_pdl:.0f} us ({1e6 / mma_pdl:,.0f} tok/s).", ""]
        lines += ["16 requests decoding together (a batch graph: each at its own "
                  f"{CONTEXT}-token cache, attention reading each one's keys and values):", ""]
        for label, mma in (("default", False), ("`TINYLOOP_CUDA_MMA_ROWS=1`", True)):
            one = sum(r["us"] * r["calls"] for r in latency_rows(shape, sass, mma=mma))
            batch = sum(r["us"] * r["calls"] for r in latency_rows(shape, sass, rows=16, mma=mma, requests=True))
            lines.append(f"- {label}: a step {batch:,.0f} us, {16e6 / batch:,.0f} tok/s in all, "
                         f"{16 * one / batch:.1f}x one request's")
        lines.append("")
    return "\n".join(lines)


def attention_share(s: dict, sass: dict | None = None, context: int = CONTEXT,
                    kv_mode: str = "fp16") -> dict:
    """Attention's part of the latency-aware 1-row step at `context` tokens of a `kv_mode` cache:
    {attention_us, step_us, share} (per token: every layer instance's call)."""
    rows = latency_rows(s, sass, context=context, kv_mode=kv_mode)
    step = sum(r["us"] * r["calls"] for r in rows)
    attention = sum(r["us"] * r["calls"] for r in rows if r["kernel"].startswith("attention_"))
    return {"attention_us": attention, "step_us": step, "share": attention / step}


def attention_byte_share(s: dict, context: int = CONTEXT, kv_mode: str = "fp16") -> float:
    """Attention's share of the step's bytes: its share of the time if every kernel streamed at
    4.8 TB/s with no launch gaps, the floor no kernel work can take it under."""
    rows = step_rows(s, context=context, kv_mode=kv_mode)
    return (sum(b * c for k, b, c in rows if k.startswith("attention_")) / sum(b * c for _, b, c in rows))


def long_context_table(sass: dict | None = None) -> str:
    """Attention's share of the step at CONTEXT and LONG_CONTEXT tokens, per KV cache mode."""
    lines = [f"Attention at {LONG_CONTEXT:,} tokens of context (the target: at most "
             f"{ATTENTION_SHARE_TARGET:.0%} of a step), the latency-aware 1-row step with each KV cache mode "
             "read by its own kernel and hot loop (int4-h's rotations of the query and the output not "
             "counted). The bytes' share is attention's part of the step's bytes: its share were every "
             "kernel at 4.8 TB/s with no launch gaps, so no kernel work takes it lower.", ""]
    for name, shape in SHAPES.items():
        lines += [f"**{name}**", "", f"| KV cache | attention at {CONTEXT:,} (us / token) | share | "
                  f"attention at {LONG_CONTEXT:,} (us / token) | share | bytes' share | step at {LONG_CONTEXT:,} |",
                  "|---|---|---|---|---|---|---|"]
        for mode in ("fp16", "int8", "int4", "int4-h"):
            near, far = (attention_share(shape, sass, context, mode) for context in (CONTEXT, LONG_CONTEXT))
            lines.append(f"| {mode} | {near['attention_us']:.0f} | {near['share']:.0%} | {far['attention_us']:.0f} | "
                         f"{far['share']:.0%} | {attention_byte_share(shape, LONG_CONTEXT, mode):.0%} | "
                         f"{far['step_us']:.0f} us ({1e6 / far['step_us']:,.0f} tok/s) |")
        lines.append("")
    return "\n".join(lines)


def tables() -> str:
    lines = [f"Decode step, batch 1, fp16 KV cache at {CONTEXT} tokens of context; memory time at 4.8 TB/s. "
             "Each norm rides on the linear after it (qkv, up, head: the rows kernels stage norm(h), and "
             "with `TINYLOOP_CUDA_MMA_ROWS=1` linear_mma does too, for calls of up to 4 rows), the KV write on "
             "the qkv linear (on either path) and a "
             "SwiGLU on the down projection (which stages swiglu(up)); with `TINYLOOP_CUDA_MMA_ROWS=1` "
             "the SwiGLU is a launch of its own again.", ""]
    for name, shape in SHAPES.items():
        rows = step_rows(shape)
        lines += [f"**{name}**", "", "| kernel | bytes / call | us / call at 4.8 TB/s | calls / token | "
                  "us / token |", "|---|---|---|---|---|"]
        total_bytes = 0
        for kernel, nbytes, calls in rows:
            lines.append(f"| {kernel} | {nbytes:,} | {nbytes / HBM * 1e6:.2f} | {calls} | "
                         f"{nbytes * calls / HBM * 1e6:.1f} |")
            total_bytes = total_bytes + nbytes * calls
        lines += [f"| **step** | {total_bytes:,} | | {launches(rows)} launches | {total_bytes / HBM * 1e6:.0f} "
                  f"(bound: {HBM / total_bytes:,.0f} tok/s) |", ""]
    lines += [latency_table(), "", long_context_table(), ""]
    found = resources()
    if found:
        lines += ["Occupancy on an H200 SM from the sm_90 ptxas figures (cuda/RESOURCES.md) at the "
                  "launchers' block sizes (dynamic shared memory not counted):", "",
                  "| kernel | threads / block | registers | static smem (B) | occupancy |", "|---|---|---|---|---|"]
        for kernel, (registers, smem) in sorted(found.items()):
            threads = next((t for prefix, t in BLOCK_THREADS.items() if kernel.startswith(prefix)), 256)
            lines.append(f"| `{kernel}` | {threads} | {registers} | {smem} | "
                         f"{occupancy(registers, smem, threads):.0%} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    text = tables()
    print(text)
    if args.write:
        readme = ROOT / "cuda" / "README.md"
        begin, end = "<!-- estimates: scripts/cuda_estimates.py --write -->", "<!-- end of estimates -->"
        content = readme.read_text()
        block = f"{begin}\n{text}\n{end}"
        if begin in content:
            content = content[:content.index(begin)] + block + content[content.index(end) + len(end):]
        else:
            content += f"\n## Estimates, before a GPU has run them\n\n{block}\n"
        readme.write_text(content)
    return 0


if __name__ == "__main__":
    sys.exit(main())
