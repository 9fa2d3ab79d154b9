"""The GPU paper model (scripts/sass_loops.py, scripts/cuda_estimates.py): its counting rules
on hand-written machine code, its arithmetic against Little's law worked by hand, and that
cuda/README.md shows what the committed figures give (no compiler needed: SASS.md and
RESOURCES.md are committed, as the scripts write them)."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import cuda_estimates  # noqa: E402
import sass_loops  # noqa: E402

# nvdisasm -g shaped text: a kernel with one loop (.L_x_1 .. the backward BRA) whose body
# issues two 16-byte loads together, uses the first (the round ends), then a 2-byte load whose
# address comes from an earlier load's register, then a load that waits on nothing.
SASS = """
//--------------------- .text.k      --------------------------
.text.k:
	//## File "/x/cuda/k.cu", line 10
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
	//## File "/x/cuda/k.cu", line 12
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   LDG.E.128 R8, desc[UR4][R2.64+0x10] ;
	//## File "/x/cuda/k.cu", line 13
        /*0030*/                   FADD R12, R4, R5 ;
        /*0040*/                   LDG.E.U16 R13, desc[UR4][R10.64] ;
        /*0050*/                   FMUL R14, R13, R12 ;
        /*0060*/                   STS [R0], R14 ;
        /*0070*/                   LDG.E R15, desc[UR4][R2.64+0x20] ;
        /*0080*/                   FFMA R16, R15, R15, R14 ;
        /*0090*/               @P0 BRA `(.L_x_1) ;
        /*00a0*/                   EXIT ;
"""


def test_sass_loops_counts_rounds_bytes_and_tags():
    kernels = sass_loops.parse(SASS)
    assert list(kernels) == ["k"] and len(kernels["k"]) == 11
    loops, n_loops = sass_loops.loops_of(kernels["k"], {("k.cu", 12): "stage"})
    assert n_loops == 1 and len(loops) == 1
    loop = loops[0]
    assert (loop.start, loop.end) == (0x10, 0x90)
    assert loop.tags == ["stage"] and loop.by_tag == {"stage": 2}
    assert loop.instructions == 9 and loop.global_loads == 4
    assert loop.load_bytes_per_lane == 16 + 16 + 2 + 4
    # round 1: the two 128-bit loads (the FADD waits on R4); round 2: the U16 load; round 3:
    # the 32-bit load, after the FMUL waited on R13
    assert loop.rounds == 3
    assert loop.float_ops == 3 and loop.shared_stores == 1
    assert loop.widths == {"16": 2, "2": 1, "4": 1}


def test_a_load_whose_address_is_pending_starts_a_round():
    text = SASS.replace("FADD R12, R4, R5", "MOV R12, RZ")      # nothing uses round 1 before the U16 load
    loops, _ = sass_loops.loops_of(sass_loops.parse(text)["k"], {("k.cu", 12): "stage"})
    # the U16 load's address R10 belongs to the 128-bit load at R8: it cannot travel with it
    assert loops[0].rounds == 3


def test_untagged_loops_are_left_out():
    loops, n_loops = sass_loops.loops_of(sass_loops.parse(SASS)["k"], {("k.cu", 99): "elsewhere"})
    assert n_loops == 1 and loops == []


def test_expected_fraction_is_littles_law_and_the_issue_rate():
    # a warp with 4 KiB per round; 8 resident warps, 10,000 launched: 32 KiB in flight per SM.
    # One SM's share of 4.8 TB/s over 132 SMs is 36.36 GB/s; x 600 ns = 21,818 bytes needed.
    loop = cuda_estimates.LoopFigures(instructions=100, bytes_per_lane=128, rounds=1)
    got = cuda_estimates.expected_fraction(loop, resident_warps=8, launched_warps=10_000)
    assert got["in_flight"] == pytest.approx(8 * 4096)
    assert got["latency"] == pytest.approx(8 * 4096 / (4.8e12 / 132 * 600e-9))
    # issue: 4 x 1.98e9 warp instructions/s per SM, 4096 bytes per 100 of them
    assert got["issue"] == pytest.approx(4 * 1.98e9 * 4096 / 100 / (4.8e12 / 132))
    assert got["fraction"] == 1.0
    # a launch with fewer warps than the SMs hold: 264 warps over 132 SMs = 2 per SM
    few = cuda_estimates.expected_fraction(loop, resident_warps=8, launched_warps=264)
    assert few["in_flight"] == pytest.approx(2 * 4096) and few["fraction"] == pytest.approx(few["latency"])


def test_the_readme_shows_the_committed_figures():
    """cuda/README.md's estimates are what scripts/cuda_estimates.py gives from the committed
    cuda/SASS.md and cuda/RESOURCES.md (rerun it with --write after changing either)."""
    readme = (ROOT / "cuda" / "README.md").read_text()
    assert cuda_estimates.tables() in readme


def test_the_model_reads_the_kernels_hot_loops():
    """The committed SASS figures hold the loops the model names: attention's 16-byte stager
    (one round trip per batch on a decode's blocks) and the rows linear's batch loop."""
    stage = cuda_estimates.hot_loop("attention_fp16")
    assert stage is not None and stage.rounds == 1 and stage.bytes_per_lane >= 8 * 16
    one_row = cuda_estimates.hot_loop("linear_rows_int4", 1)
    # a batch of two chunks of 4 words a lane (two 16-byte loads), each chunk with a 32-column
    # group's half scale and min: 40 bytes a lane from DRAM, one round an iteration
    assert one_row is not None and one_row.bytes_per_lane == 8 * (4 + 4 * 8 / 32) and one_row.rounds == 1


def test_the_merge_tail_and_the_mma_figures_follow_the_machine_code():
    """The fused merge's tail: the counter's round trip, then one L2 round trip per batch of
    ATT_MERGE_BATCH chunks at the tagged loop's rounds (worked by hand: 32 chunks, batches of
    16, 1 round each -> 600 + 2 x 300 ns); the committed SASS has that loop at one round, and
    linear_mma_int4's batch loop with its 16-byte weight loads."""
    fake = {"kernels": {"attention_fp16": {"loops": [{"tags": ["attention-merge"], "rounds": 1}]}}}
    assert abs(cuda_estimates.merge_tail_s(32, fake) - 1.2e-6) < 1e-12
    assert abs(cuda_estimates.merge_tail_s(16, fake) - 0.9e-6) < 1e-12
    assert abs(cuda_estimates.merge_tail_s(17, fake) - 1.2e-6) < 1e-12
    saved = cuda_estimates.sass_loops.read_saved()["kernels"]
    assert min(l["rounds"] for l in saved["attention_fp16"]["loops"] if "attention-merge" in l["tags"]) == 1
    batch = [l for l in saved["linear_mma_int4"]["loops"] if "linear-mma-weights" in l["tags"]]
    assert batch and all(l["widths"].get("16", 0) >= 8 for l in batch)
    assert cuda_estimates.mma_call(2048, 6144, 16)["detail"]["splits"] == 1


def mma_loops(loops):
    """linear_mma's plain batch loop and the staging loops inside it (the whole-items loop, its
    edge loop, the checked loop), from the machine code."""
    body = min((l for l in loops if "linear-mma-weights" in l["tags"] and "linear-mma-norm" not in l["tags"]),
               key=lambda l: l["instructions"])
    inside = [l for l in loops if body["start"] <= l["start"] and l["end"] <= body["end"]]
    whole = [l for l in inside if l["tags"] == ["linear-mma-stage"]]
    edge = [l for l in inside if l["tags"] == ["linear-mma-stage-edge"]]
    checked = [l for l in inside if l["tags"] == ["linear-mma-stage-checked"]]
    assert len(whole) == len(edge) == len(checked) == 1
    return body, whole[0], edge[0], checked[0]


def test_the_staging_runs_two_rows_a_pass():
    """A float x's batch runs the whole-items loop, a pair of rows (r, r + 8) a pass: doc-407m's
    weights, and SmolLM2's 576 inputs (3 splits of 256, the last 64: its 24 edge items past
    in_features, which the whole-items loop skips, a row a pass in the edge loop, 16 x 24 over
    128 threads, 3 passes at 16 rows and 1 at one). Worked from the machine code at 16 rows and 1 (one row a pass at one row):
    the products are the batch loop less its three staging loops, and the whole-items loop
    takes fewer instructions a pass than half the checked loop's."""
    loops = cuda_estimates.sass_loops.read_saved()["kernels"]["linear_mma_int4"]["loops"]
    body, whole, edge, checked = mma_loops(loops)
    assert whole["instructions"] < checked["instructions"] / 2
    assert whole["widths"].get("16", 0) == 4 and whole["shared_stores"] == 2
    products = body["instructions"] - whole["instructions"] - edge["instructions"] - checked["instructions"]

    def expected(n_in, n_out, rows, stage, passes_rows, edge_passes, edge_items):
        split_k = cuda_estimates.linear_launch.mma_split_k(n_in, n_out)
        chunks = split_k // 128
        splits = -(-n_in // split_k)
        parts = min(cuda_estimates.linear_launch.mma_parts(splits, rows), splits)   # 3 splits: 3 of 4 parts staged
        return (products * chunks / 4 + stage * passes_rows * (chunks * 16 * parts - edge_items) / 128
                + edge_passes * edge["instructions"])

    # (passes, items) of the edge loop at 1 row and at 16: SmolLM2's last part's 24 edge items
    for n_in, n_out, stage, pair, edges in ((2048, 6144, whole, True, ((0, 0), (0, 0))),
                                            (8192, 2048, whole, True, ((0, 0), (0, 0))),
                                            (576, 960, whole, True, ((1, 24), (3, 24)))):
        for rows, (edge_passes, edge_items) in zip((1, 16), edges):
            assert tuple(cuda_estimates.mma_edge_staging(n_in, n_out, rows)) == (edge_passes, edge_items)
            call = cuda_estimates.mma_call(n_in, n_out, rows)
            instructions = expected(n_in, n_out, rows, stage["instructions"], min(rows, 8) if pair else rows,
                                    edge_passes, edge_items)
            # issue = 4 x clock x 32 x bytes a lane / instructions / BW_SM: instructions from it
            bytes_lane = cuda_estimates.linear_launch.mma_split_k(n_in, n_out) // 128 * 2 * 20
            got = (cuda_estimates.ISSUE_PER_SM * cuda_estimates.SM_CLOCK_HZ * 32 * bytes_lane
                   / call["detail"]["issue"] / cuda_estimates.BW_SM)
            assert got == pytest.approx(instructions, abs=1), (n_in, rows)


def test_the_edge_loops_passes_in_the_busiest_block():
    """mma_edge_staging (passes, edge items), worked by hand from linear_mma.cu's loops: 700 inputs into 64 outputs
    split as 3 splits of 256 (4 parts, 3 staged); the last part's 32 items from column 512, of
    which 188 // 8 = 23 lie before in_features: 9 edge items, 16 x 9 = 144 (row, item)s over 128
    threads: 2 passes at 16 rows, 1 at one row. Past 16 rows (a block a split, a tile of 16 rows
    a block) SmolLM2's 576 inputs: the third split's block stages its own one chunk (16 items,
    not part 0's two), columns 512 .. 639, 8 edge items, 16 x 8 = 128: 1 pass a tile.
    Widths that fill every item: none."""
    assert cuda_estimates.linear_launch.mma_split_k(700, 64) == 256
    assert tuple(cuda_estimates.mma_edge_staging(700, 64, 16)) == (2, 9)
    assert tuple(cuda_estimates.mma_edge_staging(700, 64, 1)) == (1, 9)
    assert cuda_estimates.linear_launch.mma_parts(3, 32) == 1
    assert tuple(cuda_estimates.mma_edge_staging(576, 960, 32)) == (1, 8)
    assert tuple(cuda_estimates.mma_edge_staging(2048, 6144, 16)) == (0, 0)
    assert tuple(cuda_estimates.mma_edge_staging(768, 64, 16)) == (0, 0)


def test_a_blocks_parts_cost_no_round_trip_and_multiply_the_staging(monkeypatch):
    """linear_mma's splits: doc-407m's down projection (32 column blocks of 64) takes 2 splits,
    both in one block (2 parts: no partials, no round trip); past a tile of rows (17) one split
    a block, whose sum costs the counter's round trip and one from L2 a split. A block stages
    each of its parts' inputs: at 16 rows, more parts issue more staging passes (worked from
    the machine code's batch loop and staging loops: the body less both staging loops a batch,
    plus the whole-items loop's passes, 8 pairs of rows x 16 items a chunk over 128 threads,
    times the parts that hold a split: 4 parts over the down projection's 2 splits stage 2). And
    the staging buffers (2 x 16.1 KiB a part) leave an SM one block of 4 parts."""
    one, tiles = cuda_estimates.mma_call(8192, 2048, 1), cuda_estimates.mma_call(8192, 2048, 17)
    assert (one["detail"]["splits"], one["detail"]["parts"], one["extra_s"], one["partials"]) == (2, 2, 0.0, 0)
    assert tiles["detail"]["parts"] == 1 and tiles["extra_s"] == pytest.approx(600e-9 + 2 * 300e-9)
    loops = cuda_estimates.sass_loops.read_saved()["kernels"]["linear_mma_int4"]["loops"]
    body, whole, edge, checked = mma_loops(loops)
    issue = {}
    for parts in (1, 4):
        monkeypatch.setattr(cuda_estimates.linear_launch, "mma_parts", lambda splits, rows, parts=parts: parts)
        issue[parts] = cuda_estimates.mma_call(8192, 2048, 16)["detail"]["issue"]
    chunks = 32                                            # a split of 4,096 stored columns
    products = body["instructions"] - whole["instructions"] - edge["instructions"] - checked["instructions"]
    # the parts that hold a split: 4 parts over 2 splits stage 2
    by_parts = {p: products * chunks / 4 + chunks * whole["instructions"] * 8 * 16 * min(p, 2) / 128 for p in (1, 4)}
    assert issue[1] / issue[4] == pytest.approx(by_parts[4] / by_parts[1], rel=0.01)
    assert cuda_estimates.resident_warps("linear_mma_int4", 128, cuda_estimates.linear_launch.mma_shared_bytes(4)) == 4


def test_tensor_core_rows_fold_the_norm_up_to_four_rows_and_stage_only_their_rows():
    """TINYLOOP_CUDA_MMA_ROWS: the pre-norm rides on linear_mma (qkv, up, head) for up to
    MMA_NORM_FOLD_MAX_ROWS rows, as the backend does, and the KV write on its qkv call: a
    doc-407m decode step launches no norm and no kv_write (173 launches, as on the rows kernels),
    a 16-row verify the 69 norms. A normed call of 4 rows issues more instructions than a plain one (its staging, from the
    machine code's normed loop); its statistics (a warp's rows, two passes each for layer norm,
    from L2) are hidden by the first batch's DRAM round trip up to one row a warp, and past it
    cost the rest (worked by hand: 16 rows, 4 a warp, 8 round trips of 300 ns less 600). A call
    stages only its rows: one row issues fewer instructions than 16."""
    doc = cuda_estimates.SHAPES["doc-407m (8 loops)"]
    one = cuda_estimates.latency_rows(doc, mma=True)
    assert not any(r["kernel"] == "layer_norm" or r["kernel"].startswith("kv_write") for r in one)
    assert cuda_estimates.launches(one) == 173
    # the folded KV write's tail on the qkv call: the fence and count, then the row's load
    qkv = {r["kernel"]: r for r in one}["linear_mma qkv (+ the KV write, RoPE of the keys)"]
    moved = qkv["bytes"] / (cuda_estimates.HBM * qkv["fraction"])
    call_s = cuda_estimates.mma_call(2048, 6144, 1, norm="layer")["extra_s"]
    assert qkv["us"] == pytest.approx((moved + cuda_estimates.LAUNCH_GAP_S + call_s + 2 * cuda_estimates.LATENCY_S) * 1e6)
    assert sum(1 for r in one if r["kernel"].startswith("linear_mma")) == 5        # qkv, out, up, down, head
    sixteen = {r["kernel"]: r for r in cuda_estimates.latency_rows(doc, rows=16, mma=True)}
    assert sixteen["layer_norm"]["calls"] == 69
    # at the most rows the fold takes, 4 (at one row the normed pass, a sixteenth of a tile's,
    # weighs about what the plain batch's setup of its staging loops does)
    plain, normed = cuda_estimates.mma_call(2048, 6144, 4), cuda_estimates.mma_call(2048, 6144, 4, norm="layer")
    assert normed["detail"]["issue"] < plain["detail"]["issue"]
    assert cuda_estimates.mma_call(2048, 6144, 1)["detail"]["issue"] > cuda_estimates.mma_call(2048, 6144, 16)["detail"]["issue"]
    assert cuda_estimates.mma_call(2048, 6144, 4, norm="layer")["extra_s"] == 0.0
    assert cuda_estimates.mma_call(2048, 6144, 16, norm="layer")["extra_s"] == pytest.approx(8 * 300e-9 - 600e-9)
    assert cuda_estimates.mma_call(2048, 6144, 16, norm="rms")["extra_s"] == pytest.approx(4 * 300e-9 - 600e-9)


def test_the_rows_kernels_fused_norm_statistics_cost_a_pass_a_chunk():
    """The rows kernels' fused norm finds its rows' statistics a warp a row, all of a chunk at
    once (rows_norm_stats): a round trip from L2 (300 ns) a pass (two for layer norm, one for
    RMS; per 2,048 elements) a chunk, the chunks (4 rows while as many are left, then 2, then
    1, as linear_rows_of runs them) one after another; a chunk of 1 or 2 rows whose words fit a
    tile (the resident path) issues its first weights before them, which hides a DRAM round
    trip (600 ns). Worked by hand: doc-407m's qkv (2,048 inputs) 0 at one row and at 3 (2 + 1,
    both resident), 2 x 300 ns at 5 (a tiled 4, then 1), 4 chunks x 2 x 300 ns at 16; 8,192
    inputs (four passes a row) 9.6 us at 16; SmolLM2's (576, RMS) 4 x 300 ns at 16; a 16-row
    verify's qkv pays it on top of the rest."""
    doc, smol = cuda_estimates.SHAPES["doc-407m (8 loops)"], cuda_estimates.SHAPES["SmolLM2-135M"]
    assert cuda_estimates.rows_chunks(7) == [4, 2, 1] and cuda_estimates.rows_chunks(16) == [4] * 4
    assert cuda_estimates.rows_norm_stats_s(doc, 1, 2048) == 0.0
    assert cuda_estimates.rows_norm_stats_s(doc, 3, 2048) == 0.0
    assert cuda_estimates.rows_norm_stats_s(doc, 5, 2048) == pytest.approx(600e-9)
    assert cuda_estimates.rows_norm_stats_s(doc, 16, 2048) == pytest.approx(2.4e-6)
    assert cuda_estimates.rows_norm_stats_s(doc, 16, 8192) == pytest.approx(9.6e-6)     # four passes a row
    # a 2-row chunk too wide for one tile (8,192 int4 inputs: 1,024 words, a 2-row tile 512) is tiled
    assert cuda_estimates.rows_norm_stats_s(doc, 2, 8192) == pytest.approx(8 * 300e-9)     # 2 passes x 4 steps
    assert cuda_estimates.rows_norm_stats_s(smol, 16, 576) == pytest.approx(1.2e-6)
    qkv = {r["kernel"]: r for r in cuda_estimates.latency_rows(doc, rows=16)}[cuda_estimates.QKV_FOLDED]
    moved = qkv["bytes"] / (cuda_estimates.HBM * qkv["fraction"])
    assert qkv["us"] == pytest.approx((moved + cuda_estimates.LAUNCH_GAP_S + 2 * cuda_estimates.LATENCY_S + 2.4e-6) * 1e6)
    # the pair's up projection stages norm(h2) too: its statistics on top of the handoff, no gap
    up = {r["kernel"]: r for r in cuda_estimates.latency_rows(doc, rows=16, paired=True)}[cuda_estimates.UP_PAIRED_GELU]
    moved = up["bytes"] / (cuda_estimates.HBM * up["fraction"])
    assert up["us"] == pytest.approx((moved + 2 * cuda_estimates.LATENCY_S + 2.4e-6) * 1e6)


def test_bench_gpu_sums_each_kernels_time_between_events():
    """scripts/bench_gpu.py's per-kernel table: launch i's time is the gap between the event
    before it and the one after; rows group by kernel and grid, largest first."""
    import bench_gpu

    class Mark:                                   # an event's device timestamp, in ms
        def __init__(self, ms):
            self.ms = ms
    marks = [("a", (1, 1, 1), Mark(0.010)), ("b", (4, 1, 1), Mark(0.030)), ("a", (1, 1, 1), Mark(0.035)),
             ("a", (2, 1, 1), Mark(0.036))]
    rows = bench_gpu.kernel_rows(Mark(0.0), marks, lambda start, stop: stop.ms - start.ms)
    assert [(r["kernel"], r["grid"], r["calls"]) for r in rows] == [("b", [4, 1, 1], 1), ("a", [1, 1, 1], 2),
                                                                    ("a", [2, 1, 1], 1)]
    assert [round(r["total_us"], 6) for r in rows] == [20.0, 15.0, 1.0]
    assert rows[1]["mean_us"] == pytest.approx(7.5) and sum(r["share"] for r in rows) == pytest.approx(1.0)


def test_dependent_launch_takes_its_gap_at_every_launch_and_nothing_else():
    """The PDL line of the paper model: each kernel's time with PDL_GAP_S in place of LAUNCH_GAP_S,
    the rest of the step unchanged."""
    for shape in cuda_estimates.SHAPES.values():
        plain = cuda_estimates.latency_rows(shape)
        dependent = cuda_estimates.latency_rows(shape, gap_s=cuda_estimates.PDL_GAP_S)
        assert [r["kernel"] for r in plain] == [r["kernel"] for r in dependent]
        for a, b in zip(plain, dependent):
            assert a["us"] - b["us"] == pytest.approx((cuda_estimates.LAUNCH_GAP_S - cuda_estimates.PDL_GAP_S) * 1e6)


def test_attention_reads_each_kv_modes_stored_rows_at_the_context():
    """Attention's bytes at 1,024 and 4,096 tokens differ by 3,072 stored rows of the mode's
    layout (worked by hand for doc-407m, 16 kv heads of 128, both sides: fp16 2 B an element;
    int8 1 B and int4 half a byte, plus a half scale and min per group of 32) and the chunk
    partials of 48 more 64-key chunks (16 heads x (128 + 2) floats, written and read); each
    mode is read by its own kernel, whose hot loop the latency model takes."""
    doc = cuda_estimates.SHAPES["doc-407m (8 loops)"]
    stored_row = {"fp16": 2 * 16 * 128 * 2, "int8": 2 * 16 * (128 + 4 * 4), "int4": 2 * 16 * (64 + 4 * 4)}
    kernel = {"fp16": "attention_fp16", "int8": "attention_int8", "int4": "attention_int4"}
    partials = 2 * 16 * 130 * 4 * (4096 - 1024) // 64
    for mode, row in stored_row.items():
        near, far = ([r for r in cuda_estimates.step_rows(doc, context=c, kv_mode=mode) if r[0].startswith("attention")]
                     for c in (1024, 4096))
        assert len(near) == len(far) == 1 and near[0][0].split()[0] == kernel[mode]
        assert far[0][1] - near[0][1] == 3072 * row + partials
        timed = [r for r in cuda_estimates.latency_rows(doc, context=4096, kv_mode=mode)
                 if r["kernel"].startswith("attention")][0]
        loop = cuda_estimates.hot_loop(kernel[mode])
        assert loop is not None and timed["detail"]["issue"] == pytest.approx(
            cuda_estimates.expected_fraction(loop, 1, 1)["issue"])


def test_attention_share_is_its_part_of_the_same_step():
    """attention_share: attention's rows of the latency-aware step over the whole step, at the
    context and mode asked; attention_byte_share the same with bytes (no latency, no gaps)."""
    doc = cuda_estimates.SHAPES["doc-407m (8 loops)"]
    rows = cuda_estimates.latency_rows(doc, context=4096, kv_mode="int8")
    figures = cuda_estimates.attention_share(doc, context=4096, kv_mode="int8")
    step = sum(r["us"] * r["calls"] for r in rows)
    attention = [r["us"] * r["calls"] for r in rows if r["kernel"].startswith("attention")]
    assert figures["step_us"] == pytest.approx(step) and figures["attention_us"] == pytest.approx(attention[0])
    assert figures["share"] == pytest.approx(attention[0] / step)
    by_bytes = cuda_estimates.step_rows(doc, context=4096, kv_mode="int8")
    total = sum(b * c for _, b, c in by_bytes)
    assert cuda_estimates.attention_byte_share(doc, 4096, "int8") == pytest.approx(
        [b * c for k, b, c in by_bytes if k.startswith("attention")][0] / total)
    # more context, a larger share; a smaller stored row, a smaller one
    assert (cuda_estimates.attention_byte_share(doc, 1024, "fp16") < cuda_estimates.attention_byte_share(doc, 4096, "fp16"))
    assert (cuda_estimates.attention_byte_share(doc, 4096, "int4") < cuda_estimates.attention_byte_share(doc, 4096, "int8")
            < cuda_estimates.attention_byte_share(doc, 4096, "fp16"))


def test_a_swiglu_models_step_stages_the_gate_in_the_down_projection():
    """SmolLM2's fused step (the rows kernels) has no swiglu launch: its down projection reads the
    up projection's 2 x 1,536 outputs instead of the swiglu kernel's 1,536 (6,144 bytes more,
    worked by hand), 30 launches fewer; with the tensor-core rows (no fold) the launch stays."""
    smol = cuda_estimates.SHAPES["SmolLM2-135M"]
    fused = {k: (b, c) for k, b, c in cuda_estimates.step_rows(smol)}
    apart = {k: (b, c) for k, b, c in cuda_estimates.step_rows(smol, fused_norm=False)}
    assert "swiglu" not in fused and apart["swiglu"][1] == 30
    assert fused[cuda_estimates.DOWN_SWIGLU][0] - apart["linear_rows down (+ residual)"][0] == 1536 * 4
    assert sum(c for b, c in fused.values()) == 153
    doc = {k for k, _, _ in cuda_estimates.step_rows(cuda_estimates.SHAPES["doc-407m (8 loops)"])}
    assert "linear_rows down (+ residual)" in doc and cuda_estimates.DOWN_SWIGLU not in doc   # GELU: nothing to stage


def test_the_paired_step_counts_the_up_projection_without_a_launch():
    """With the pair (TINYLOOP_CUDA_PAIR=1, int4 weights on the fused path) the up projection
    moves the same bytes but launches nothing of its own: doc-407m 173 -> 139 launches a step (one
    a layer instance fewer, 34), SmolLM2 153 -> 123; its time pays the handoff, two round trips,
    instead of the launch gap, and the pair kernel's lower occupancy. Off (the default), or on
    the tensor-core rows (no fold), nothing pairs."""
    for name, instances, plain_launches in (("doc-407m (8 loops)", 34, 173), ("SmolLM2-135M", 30, 153)):
        shape = cuda_estimates.SHAPES[name]
        plain, paired = cuda_estimates.step_rows(shape), cuda_estimates.step_rows(shape, paired=True)
        assert cuda_estimates.launches(plain) == plain_launches
        assert cuda_estimates.launches(paired) == plain_launches - instances
        assert sum(b * c for _, b, c in plain) == sum(b * c for _, b, c in paired)
        assert cuda_estimates.step_rows(shape, fused_norm=False, paired=True) == \
            cuda_estimates.step_rows(shape, fused_norm=False)
        timed = {r["kernel"]: r for r in cuda_estimates.latency_rows(shape, paired=True)}
        apart = {r["kernel"]: r for r in cuda_estimates.latency_rows(shape)}
        up = cuda_estimates.UP_PAIRED if shape["mlp"] == "swiglu" else cuda_estimates.UP_PAIRED_GELU
        up_apart = "linear_rows up" + ("" if shape["mlp"] == "swiglu" else " (+ GELU)")
        handoff = 2 * cuda_estimates.LATENCY_S - cuda_estimates.LAUNCH_GAP_S
        # and streams its bytes at the pair kernel's occupancy: one block an SM (183 registers on
        # sm_90: 5,888 a warp, 65,536 / (8 x 5,888) = 1 block of 8 warps), half the single call's
        assert cuda_estimates.resident_warps("linear_rows_pair_int4", 256) == 8
        assert cuda_estimates.resident_warps("linear_rows_int4", 256) == 16
        assert timed[up]["fraction"] < apart[up_apart]["fraction"]
        moved = timed[up]["bytes"] / cuda_estimates.HBM
        slower = moved / timed[up]["fraction"] - moved / apart[up_apart]["fraction"]
        assert timed[up]["us"] - apart[up_apart]["us"] == pytest.approx((handoff + slower) * 1e6)
    int8 = dict(cuda_estimates.SHAPES["doc-407m (8 loops)"], core_bits=8)
    assert cuda_estimates.launches(cuda_estimates.step_rows(int8, paired=True)) == 173   # no int8 pair


def test_attention_sums_cost_the_machine_codes_instructions():
    """A verify's attention is bound by its sums: per (query, head, key, d) element, the score's
    instructions (the innermost tagged scores loop with the most float operations, a multiply and
    an add an element) plus the value's: the unmasked tree (the cheapest innermost tagged values
    loop, a tree of att_tree_leaves keys of 4 columns) and the join loops of two halves around it,
    level k from the outermost run 2^(k+1) times a 64-key block. Worked by hand on a fake machine
    code: trees of 8 (fp16: 8 trees, 3 levels) and of 4 (int4: 16 trees, 4 levels); without
    tagged loops the arithmetic alone (4); too few join loops around the tree, or a loop among
    them that is not a level (one add a lane more than the level inside), an error. The
    committed machine code lies between that and the kernel's before its 16-byte sums (4.6 +
    16.3, read from its SASS), below the 2.6 + 4.75 of its binary-counter tree, the trees of 8
    below those of 4. The 16-row step's attention takes that many instructions over the SMs its
    blocks occupy."""
    assert [cuda_estimates.att_tree_leaves(k) for k in ("attention_fp32", "attention_fp16", "attention_int8",
                                                        "attention_int4", "attention_int4h")] == [8, 8, 8, 4, 4]
    join, values = ["attention-values-join", "attention-values"], ["attention-values"]
    scores = [
        {"start": 0, "end": 100, "tags": ["attention-scores"], "instructions": 500, "float_ops": 300},  # holds the next two
        {"start": 10, "end": 20, "tags": ["attention-scores"], "instructions": 80, "float_ops": 64},
        {"start": 30, "end": 40, "tags": ["attention-scores"], "instructions": 30, "float_ops": 16}]
    four = [  # each level one add a lane (4 float operations) more than the level inside it
        {"start": 200, "end": 300, "tags": join, "instructions": 100, "float_ops": 44},   # the unmasked chain, outermost first
        {"start": 210, "end": 290, "tags": join, "instructions": 80, "float_ops": 40},
        {"start": 220, "end": 280, "tags": join, "instructions": 70, "float_ops": 36},
        {"start": 230, "end": 270, "tags": values, "instructions": 50, "float_ops": 32},
        {"start": 400, "end": 500, "tags": join, "instructions": 150, "float_ops": 44},   # the masked one
        {"start": 410, "end": 490, "tags": join, "instructions": 130, "float_ops": 40},
        {"start": 420, "end": 480, "tags": join, "instructions": 110, "float_ops": 36},
        {"start": 430, "end": 470, "tags": values, "instructions": 90, "float_ops": 32},
        {"start": 190, "end": 600, "tags": join, "instructions": 2000, "float_ops": 500}]  # a task loop around both
    eight = [{**l, "tags": values} if l["start"] in (220, 420) else l         # the tree one level up
             for l in four if l["start"] not in (230, 430)]
    fake = {"kernels": {"attention_int4": {"loops": scores + four}, "attention_fp16": {"loops": scores + eight}}}
    assert cuda_estimates.attention_sum_instructions("attention_int4", fake) == pytest.approx(
        80 / 32 + (2 * 20 + 4 * 10 + 8 * 20 + 16 * 50) / 256)
    assert cuda_estimates.attention_sum_instructions("attention_fp16", fake) == pytest.approx(
        80 / 32 + (2 * 20 + 4 * 10 + 8 * 70) / 256)
    assert cuda_estimates.attention_sum_instructions("attention_fp16", {"kernels": {}}) == 4
    short = {"kernels": {"attention_int4": {"loops": [l for l in scores + four if l["start"] not in (210, 190)]}}}
    with pytest.raises(ValueError, match="join loops"):
        cuda_estimates.attention_sum_instructions("attention_int4", short)
    # a level unrolled: the task loop around the chain would be taken for the outermost level
    unrolled = {"kernels": {"attention_int4": {"loops": [l for l in scores + four if l["start"] != 210]}}}
    with pytest.raises(ValueError, match="not a level of two halves"):
        cuda_estimates.attention_sum_instructions("attention_int4", unrolled)
    saved = cuda_estimates.attention_sum_instructions("attention_fp16")
    assert 4 < saved < cuda_estimates.attention_sum_instructions("attention_int4") < min(4.6 + 16.3, 2.6 + 4.75)
    doc = cuda_estimates.SHAPES["doc-407m (8 loops)"]
    attention = [r for r in cuda_estimates.latency_rows(doc, rows=16, mma=True) if r["kernel"].startswith("attention_fp16")]
    blocks = doc["kv"] * (1024 // 64)                       # each 64-key block of each kv head: 256, over all 132 SMs
    issue_s = 16 * doc["heads"] * 1024 * doc["hd"] * saved / 32 / (4 * 1.98e9 * min(132, blocks))
    assert attention[0]["detail"]["bound"] == "sums"
    assert attention[0]["fraction"] == pytest.approx(attention[0]["bytes"] / (cuda_estimates.HBM * issue_s))
