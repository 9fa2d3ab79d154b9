"""A draft tree's verify pass equals, for every node, a sequential decode of that node's
path: logits and cache rows bit for bit, over random configs (1, 2 or 4 KV heads, head
dims 8 and 16), every KV cache mode, full caches, windows and ring buffers. This is
the model-level form of "tree == sequential": logits are compared, not tokens, so a
last-bit difference cannot hide behind an unchanged argmax."""
import numpy as np
import pytest
from test_model import random_config

from tinyloop.engine.decode import prefill
from tinyloop.engine.speculative.tree import DraftTree
from tinyloop.model.loader import load_model
from tinyloop.model.modelfile import write_model_file
from tinyloop.model.testmodels import random_weights, train_tokenizer

pytestmark = pytest.mark.exactness

MODES = ["fp16", "int8", "int4", "int4-h", "fp32"]


@pytest.fixture(scope="module")
def tokenizer_json():
    return train_tokenizer().to_str()


def random_tree(rng, base: int, vocab: int) -> DraftTree:
    """Up to 6 levels of 1-4 nodes, parents drawn from the level above (at most 25 nodes)."""
    tree = DraftTree(int(rng.integers(vocab)), base)
    for _ in range(int(rng.integers(1, 7))):
        parents = tree.levels[-1]
        width = int(rng.integers(1, 5))
        tree.add_level([(int(rng.choice(parents)), int(rng.integers(vocab)), 0.0) for _ in range(width)])
    return tree


def run_nodes(model, tree, nodes, cache, loops):
    positions, write_row, tree_rows = tree.placement(nodes)
    plan = model.plan(positions, write_row, cache, tree=tree_rows)
    trunk = model.trunk(tree.tokens(nodes), plan, cache, loops)
    return model.head(model.coda(trunk.hidden, plan, cache, model.coda_base(loops)))


@pytest.mark.exactness(sample=3)
@pytest.mark.parametrize("case", range(40))
def test_tree_verify_equals_sequential_decode_of_each_path(tmp_path, tokenizer_json, case):
    rng = np.random.default_rng(2000 + case)
    config = random_config(rng, 512)
    mode = MODES[case % len(MODES)]
    window = int(rng.choice([0, 20, 70]))
    path = write_model_file(tmp_path / "m.tinyloop", config, random_weights(config, case), tokenizer_json)
    check_tree_against_paths(load_model(path, kv_mode=mode).model, rng, config, mode, window)


def check_tree_against_paths(model, rng, config, mode: str, window: int, max_plain_prompt: int = 160):
    """Verify a random draft tree after a random prompt; every node's logits and cache rows
    must equal a sequential decode of its path, bit for bit. (Also run on the CUDA backend.)"""
    to_host = model.backend.to_host
    loops = int(rng.integers(1, config.max_loops + 1))
    # with a window, a prompt long enough that the cache is a ring that has wrapped
    n_prompt = int(rng.integers(window + 135, 227)) if window else int(rng.integers(1, max_plain_prompt))
    prompt = [int(t) for t in rng.integers(0, 512, n_prompt)]
    tree = random_tree(rng, len(prompt), 512)
    capacity = len(prompt) + len(tree.nodes) + 1

    cache = model.new_cache(capacity, loops, window=window)
    prefill(model, prompt, cache, loops)
    logits = to_host(run_nodes(model, tree, list(range(len(tree.nodes))), cache, loops))     # (n_nodes, V)
    assert (cache.ring is not None) == (window > 0)

    for node in range(len(tree.nodes)):
        reference = model.new_cache(capacity, loops, window=window)
        prefill(model, prompt, reference, loops)
        path_nodes = tree.path(node)
        for depth, on_path in enumerate(path_nodes):
            position = len(prompt) + depth
            expected = to_host(model.forward([tree.nodes[on_path].token], [position], reference, loops))[0]
        assert np.array_equal(logits[node], expected), (mode, window, node)
        own_row, sequential_row = tree.base + node, tree.base + len(path_nodes) - 1
        ours, theirs = cache.stored(own_row, own_row + 1), reference.stored(sequential_row, sequential_row + 1)
        for name in theirs:
            assert np.array_equal(ours[name], theirs[name]), (mode, window, node, name)
