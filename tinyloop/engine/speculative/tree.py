"""The draft tree of one speculative round: plain bookkeeping, no arrays of activations.

Node 0 is the root: the last accepted token, not yet in the cache, at logical
position `base`. Nodes are added level by level, so node index = BFS order, and
node i is stored at cache row `base + i`. A chain is the tree with one node per level.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tinyloop.model.plan import TreeRows


@dataclass
class DraftNode:
    token: int
    parent: int                 # -1 for the root
    depth: int                  # root = 0
    score: float = 0.0          # cumulative draft log-probability (greedy trees)
    children: list = field(default_factory=list)


class DraftTree:
    def __init__(self, root_token: int, base: int):
        self.base = base
        self.nodes = [DraftNode(root_token, -1, 0)]
        self.levels = [[0]]
        self.draft_probs: dict[int, np.ndarray] = {}   # node -> q its children were drawn from

    def add_level(self, children: list[tuple[int, int, float]]) -> list[int]:
        """children: (parent, token, score) -> their new node indexes."""
        level = []
        for parent, token, score in children:
            index = len(self.nodes)
            self.nodes.append(DraftNode(token, parent, self.nodes[parent].depth + 1, score))
            self.nodes[parent].children.append(index)
            level.append(index)
        self.levels.append(level)
        return level

    @property
    def depth(self) -> int:
        return len(self.levels) - 1

    @property
    def is_chain(self) -> bool:
        return all(len(level) == 1 for level in self.levels)

    def path(self, node: int) -> list[int]:
        """Node indexes from the root to `node`, inclusive."""
        path = []
        while node != -1:
            path.append(node)
            node = self.nodes[node].parent
        return path[::-1]

    def path_tokens(self, node: int) -> list[int]:
        """Tokens drafted on the way to `node` (the root excluded)."""
        return [self.nodes[i].token for i in self.path(node)[1:]]

    def tokens(self, nodes: list[int]) -> list[int]:
        return [self.nodes[i].token for i in nodes]

    def placement(self, nodes: list[int]) -> tuple:
        """Where these nodes (consecutive indexes) sit, for a forward over them:
        (positions (T,), first virtual row, TreeRows or None for a chain)."""
        if nodes != list(range(nodes[0], nodes[0] + len(nodes))):
            raise ValueError("a forward takes consecutive tree nodes")
        positions = np.array([self.base + self.nodes[i].depth for i in nodes])
        write_row = self.base + nodes[0]
        if self.is_chain:
            return positions, write_row, None         # rows are positions: no gather needed
        width = max(self.nodes[i].depth for i in nodes) + 1
        path_rows = np.zeros((len(nodes), width), np.int64)
        for row, node in enumerate(nodes):
            path = self.path(node)
            path_rows[row, :len(path)] = [self.base + i for i in path]
        return positions, write_row, TreeRows(self.base, path_rows)
