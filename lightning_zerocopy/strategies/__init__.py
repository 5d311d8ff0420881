"""Lightning strategies of lightning-zerocopy.

Importing this package registers ``zerocopy_ddp`` in Lightning's strategy registry (so ``trainer.strategy:
zerocopy_ddp`` works in a recipe); it starts nothing.
"""

from lightning_zerocopy.cache.budget import BudgetSpec, parse_budget, resolve_budget
from lightning_zerocopy.strategies.exit_notes import PeerRankExited
from lightning_zerocopy.cache.cliques import choose_layout, find_cliques
from lightning_zerocopy.strategies.zerocopy_ddp import ZeroCopyDDPStrategy

__all__ = [
    "BudgetSpec",
    "PeerRankExited",
    "ZeroCopyDDPStrategy",
    "choose_layout",
    "find_cliques",
    "parse_budget",
    "resolve_budget",
]
