"""Parameters and statistics of self-speculative decoding."""
from __future__ import annotations

from dataclasses import dataclass, field

from tinyloop.errors import RequestError
from tinyloop.limits import MAX_BRANCHES, MAX_DRAFT_AHEAD, MAX_TREE_NODES
from tinyloop.model.config import ModelConfig


@dataclass(frozen=True)
class SpeculativeParams:
    draft_loops: int = 2
    verify_loops: int = 8
    draft_ahead: int = 4
    branches: int = 1            # K_branches: 1 = a chain

    def check(self, config: ModelConfig) -> None:
        """Raise RequestError naming the field and what is allowed."""
        for name, value, low, high in (("draft_ahead", self.draft_ahead, 1, MAX_DRAFT_AHEAD),
                                       ("K_branches", self.branches, 1, MAX_BRANCHES)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise RequestError(f"{name} must be an integer in [{low}, {high}], got {value!r}", name)
        config.check_loops(self.draft_loops, "draft_loops")
        config.check_loops(self.verify_loops, "verify_loops")
        if self.draft_loops >= self.verify_loops:
            raise RequestError(f"draft_loops ({self.draft_loops}) must be less than verify_loops "
                               f"({self.verify_loops})", "draft_loops")
        if self.branches * self.draft_ahead > MAX_TREE_NODES:
            raise RequestError(f"K_branches * draft_ahead must be at most {MAX_TREE_NODES}, got "
                               f"{self.branches} * {self.draft_ahead} = {self.branches * self.draft_ahead}",
                               "K_branches")


@dataclass
class SpeculativeStats:
    rounds: int = 0
    drafted: int = 0                    # draft tokens proposed (tree nodes below the root)
    accepted: int = 0                   # draft tokens the verifier accepted
    drafted_at_depth: list = field(default_factory=list)    # rounds that drafted depth j+1
    accepted_at_depth: list = field(default_factory=list)   # rounds that accepted depth j+1

    def record(self, depth_drafted: int, nodes_drafted: int, accepted_len: int) -> None:
        self.rounds += 1
        self.drafted += nodes_drafted
        self.accepted += accepted_len
        grow = depth_drafted - len(self.drafted_at_depth)
        if grow > 0:
            self.drafted_at_depth += [0] * grow
            self.accepted_at_depth += [0] * grow
        for depth in range(depth_drafted):
            self.drafted_at_depth[depth] += 1
        for depth in range(accepted_len):
            self.accepted_at_depth[depth] += 1

    @property
    def mean_accepted_per_round(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over draft depths tried (a tree counts one per depth)."""
        tried = sum(self.drafted_at_depth)
        return self.accepted / tried if tried else 0.0

    @property
    def acceptance_by_depth(self) -> list:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at_depth, self.drafted_at_depth)]

    def to_dict(self) -> dict:
        return {"rounds": self.rounds, "drafted_tokens": self.drafted, "accepted_tokens": self.accepted,
                "mean_accepted_per_round": round(self.mean_accepted_per_round, 4),
                "acceptance_rate": round(self.acceptance_rate, 4),
                "acceptance_by_depth": [round(r, 4) for r in self.acceptance_by_depth]}
