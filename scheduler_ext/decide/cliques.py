"""Best fit across NVLink cliques for pods that are not gangs: keep whole cliques for the gangs.

On NVL72 racks a multi-node job needs its nodes inside one NVLink clique; a clique with many
entirely free nodes is what a waiting or future gang needs. A pod that fits on one node fits in
any clique, so among the nodes the scorer ranks best for it (score 10), those in the clique with
the fewest entirely free nodes keep 10 and the rest of the clique-labelled best nodes get 9: the
pod goes where a clique is already broken, as Kueue's topology-aware "BestFit" picks the fullest
domain that fits. Nodes without a clique label are left as scored, and nothing changes where no
best node carries one (every fleet without multi-node NVLink). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from scheduler_ext.decide.verdict import MAX_SCORE


def best_fit_cliques(
    names: Sequence[str],
    scores: list[int],
    clique_of: Callable[[str], str | None],
    whole_free: Callable[[str], int],
) -> list[int]:
    """``scores`` with the clique-labelled best nodes outside the fullest clique among them moved
    to ``MAX_SCORE - 1``. ``whole_free(clique)``: that clique's nodes with every GPU free."""
    best = [i for i, s in enumerate(scores) if s == MAX_SCORE]
    cliques = {i: c for i in best if (c := clique_of(names[i])) is not None}
    if len(set(cliques.values())) < 2:
        return scores
    free = {c: whole_free(c) for c in set(cliques.values())}
    fullest = min(free.values())
    moved = list(scores)
    for i, clique in cliques.items():
        if free[clique] > fullest:
            moved[i] = MAX_SCORE - 1
    return moved


def whole_free_counts(
    labels: Mapping[str, Mapping[str, str]], is_whole_free: Callable[[str], bool], *, label: str
) -> dict[str, int]:
    """Clique -> how many of its nodes have every GPU free (``is_whole_free(node)``)."""
    counts: dict[str, int] = {}
    for node, kept in labels.items():
        clique = kept.get(label)
        if clique is not None:
            counts[clique] = counts.get(clique, 0) + int(is_whole_free(node))
    return counts
