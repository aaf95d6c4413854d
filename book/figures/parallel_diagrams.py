"""Diagrams of the chapter "Training at scale", drawn with matplotlib at build time (deterministic).

Each public function returns a ``matplotlib.figure.Figure``:

* :func:`ring_all_reduce_figure` -- the ring all-reduce of ``p`` ranks: reduce-scatter, then all-gather;
* :func:`zero_stages_figure` -- what each rank holds under DDP and ZeRO stages 1, 2 and 3;
* :func:`fsdp_cycle_figure` -- FSDP's gather / compute / free cycle per unit, without and with prefetching;
* :func:`tensor_parallel_mlp_figure` -- Megatron-LM's column-then-row split of the MLP over two ranks.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from .diagrams import COLOURS, _arrow, _box, _clean

RANK_LETTERS = "abcdefgh"


def ring_states(p: int) -> list[tuple[str, list[list[frozenset]], list[int]]]:
    """The ring all-reduce step by step, in :mod:`llmarch.parallel.ring`'s order: reduce-scatter step ``s``
    sends chunk ``(r - s) % p`` from rank ``r`` to ``r + 1``, which adds it; all-gather step ``s`` sends chunk
    ``(r + 1 - s) % p``, which overwrites. Returns ``(title, held, sent)`` per state: ``held[r][c]`` is the set
    of ranks whose chunk ``c`` rank ``r`` has summed, ``sent[r]`` the chunk rank ``r`` sends next (-1: none)."""
    held = [[frozenset({r}) for _ in range(p)] for r in range(p)]
    states = []
    for phase, chunk_of in (("reduce-scatter", lambda r, s: r - s), ("all-gather", lambda r, s: r + 1 - s)):
        for step in range(p - 1):
            sent = [chunk_of(r, step) % p for r in range(p)]
            states.append((f"{phase} step {step + 1}", [row[:] for row in held], sent))
            payloads = [held[r][sent[r]] for r in range(p)]  # everyone sends before anyone receives
            for r in range(p):
                receiver, chunk = (r + 1) % p, sent[r]
                held[receiver][chunk] = held[receiver][chunk] | payloads[r] if phase == "reduce-scatter" \
                    else payloads[r]
    states.append(("done: every rank\nholds every sum", held, [-1] * p))
    return states


def ring_all_reduce_figure(p: int = 4):
    """Rows: ranks; columns: the ``2(p - 1)`` steps. Each rank's buffer is ``p`` chunks, shaded by how many
    ranks' data they sum (letters: whose); the chunk each rank sends to its right neighbour is outlined and
    its arrow drawn."""
    _check_ring_states_against_library(p)
    states = ring_states(p)
    fig, ax = plt.subplots(figsize=(11.5, 3.3))
    cell, gap = 0.42, 0.75
    width = p * cell + gap
    cmap = plt.get_cmap("Blues")
    for column, (title, held, sent) in enumerate(states):
        x0 = column * width
        ax.text(x0 + p * cell / 2, p * 0.8 + 0.15, title.replace(" step", "\nstep"), ha="center", fontsize=7.5)
        for r in range(p):
            y = (p - 1 - r) * 0.8
            for c in range(p):
                members = held[r][c]
                face = cmap(0.15 + 0.75 * (len(members) - 1) / (p - 1))
                bold = sent[r] == c
                ax.add_patch(Rectangle((x0 + c * cell, y), cell, 0.5, fc=face, ec="crimson" if bold else "grey",
                                       lw=2.0 if bold else 0.6))
                label = "".join(RANK_LETTERS[m] for m in sorted(members))
                ax.text(x0 + (c + 0.5) * cell, y + 0.25, label, ha="center", va="center", fontsize=6,
                        color="white" if len(members) > p / 2 else "black")
            if sent[r] >= 0:  # to rank r + 1, one row down (the last rank wraps to the first)
                start = (x0 + p * cell + 0.05, y + 0.25)
                end = (x0 + p * cell + 0.05, y - 0.55) if r < p - 1 else (x0 + p * cell + 0.05, (p - 1) * 0.8 + 0.25)
                _arrow(ax, start, end, color="crimson", lw=0.8,
                       connectionstyle="arc3,rad=-0.5" if r < p - 1 else "arc3,rad=0.25")
            if column == 0:
                ax.text(-0.12, y + 0.25, f"rank {r}", ha="right", va="center", fontsize=8)
    for c in range(p):
        ax.text((c + 0.5) * cell, -0.2, str(c), ha="center", va="center", fontsize=7)
    ax.text(-0.12, -0.2, "chunk", ha="right", va="center", fontsize=7)
    ax.text(0, -0.75, f"{p} ranks, each vector cut into {p} chunks; letters: whose data a chunk sums (rank 0's is a); "
            f"outlined: the chunk each rank sends to the next (arrows).\nEach of the {2 * (p - 1)} steps sends "
            f"1/{p} of the vector per rank: 2(p - 1)/p = {2 * (p - 1) / p:g} times the vector in all.",
            fontsize=8, va="center")
    _clean(ax, (-0.9, len(states) * width - gap + 0.3), (-1.1, p * 0.8 + 0.6))
    fig.tight_layout()
    return fig


def zero_stages_figure(p: int = 4):
    """Per rank, the three model states of mixed-precision Adam (Rajbhandari et al., 2020): 16-bit weights
    (2 bytes/parameter), 16-bit gradients (2) and the optimiser states (fp32 master weights, m, v: 12), each
    drawn as a bar cut into ``p`` pieces; the pieces a rank holds are filled."""
    rows = [("DDP", 0), ("ZeRO-1: optimiser states", 1), ("ZeRO-2: + gradients", 2),
            ("ZeRO-3 / FSDP: + weights", 3)]
    states = [("weights", 2, COLOURS["emb"]), ("gradients", 2, COLOURS["ffn"]), ("optimiser", 12, COLOURS["attn"])]
    fig, ax = plt.subplots(figsize=(10.5, 4.4))
    scale, rank_width = 0.12, 2.3
    for row, (name, stage) in enumerate(rows):
        y0 = (len(rows) - 1 - row) * 1.15
        ax.text(-0.15, y0 + 0.45, name, ha="right", va="center", fontsize=9)
        per_param = 0.0
        for r in range(p):
            x0 = r * rank_width
            x = x0
            for label, nbytes, colour in states:
                sharded = stage > {"optimiser": 0, "gradients": 1, "weights": 2}[label]
                length = nbytes * scale
                for piece in range(p):
                    held = not sharded or piece == r
                    ax.add_patch(Rectangle((x + piece * length / p, y0 + 0.15), length / p, 0.6,
                                           fc=colour if held else "white", ec="grey", lw=0.5))
                if r == 0:
                    per_param += nbytes / (p if sharded else 1)
                x += length + 0.04
            if row == 0:
                ax.text(x0 + 0.95, len(rows) * 1.15, f"rank {r}", ha="center", fontsize=9)
        traffic = "3P" if stage == 3 else "2P"
        ax.text(p * rank_width + 0.1, y0 + 0.45, f"{per_param:g} bytes/param\nsends ~{traffic} per step",
                va="center", fontsize=8.5)
    for index, (label, nbytes, colour) in enumerate(states):
        ax.add_patch(Rectangle((index * 2.6, -0.55), 0.3, 0.3, fc=colour, ec="grey"))
        ax.text(index * 2.6 + 0.4, -0.4, f"{label} ({nbytes} B/param)", va="center", fontsize=8.5)
    ax.text(3 * 2.6 + 0.2, -0.4, f"white: held by another of the {p} ranks", va="center", fontsize=8.5)
    _clean(ax, (-3.2, p * rank_width + 1.9), (-0.8, len(rows) * 1.15 + 0.3))
    ax.set_aspect("auto")
    fig.tight_layout()
    return fig


def fsdp_timeline(units: int, prefetch: bool, gather: float = 0.6, forward: float = 1.0, backward: float = 2.0,
                  reduce: float = 0.6) -> list[tuple[str, float, float, str]]:
    """``(lane, start, end, label)`` of one FSDP step over ``units`` units, with a communication stream
    (all-gathers ``AG``, reduce-scatters ``RS``) and a compute stream (``F``, ``B``), each serial. Without
    prefetch an all-gather is issued when its unit is about to run; with prefetch the next unit's all-gather
    is issued as soon as the current unit starts computing (forward prefetch, and backward prefetch in the
    reverse order, issued before the current unit's reduce-scatter)."""
    ops, comm_free, compute_free = [], 0.0, 0.0
    gathered = {}
    order = [("F", u) for u in range(units)] + [("B", u) for u in reversed(range(units))]
    for index, (kind, unit) in enumerate(order):
        if (kind, unit) not in gathered:
            start = max(comm_free, compute_free if not prefetch else 0.0)
            gathered[(kind, unit)] = start + gather
            ops.append(("comm", start, start + gather, f"AG{unit}"))
            comm_free = start + gather
        start = max(compute_free, gathered[(kind, unit)])
        end = start + (forward if kind == "F" else backward)
        ops.append(("compute", start, end, f"{kind}{unit}"))
        compute_free = end
        if prefetch and index + 1 < len(order):  # issue the next unit's all-gather now
            following = order[index + 1]
            begin = max(comm_free, start)
            gathered[following] = begin + gather
            ops.append(("comm", begin, begin + gather, f"AG{following[1]}"))
            comm_free = begin + gather
        if kind == "B":
            begin = max(comm_free, end)
            ops.append(("comm", begin, begin + reduce, f"RS{unit}"))
            comm_free = begin + reduce
    return ops


def fsdp_cycle_figure(units: int = 3):
    """Two timelines of one FSDP step: gather, compute, free per unit, without and with prefetching."""
    colours = {"AG": COLOURS["cache"], "RS": COLOURS["out"], "F": COLOURS["ffn"], "B": COLOURS["attn"]}
    fig, ax = plt.subplots(figsize=(10.5, 3.4))
    lanes = [(False, "comm"), (False, "compute"), (True, "comm"), (True, "compute")]
    for lane_index, (prefetch, lane) in enumerate(lanes):
        y = (len(lanes) - 1 - lane_index) * 0.8 + (0.35 if not prefetch else 0.0)
        ops = fsdp_timeline(units, prefetch)
        for op_lane, start, end, label in ops:
            if op_lane != lane:
                continue
            kind = label.rstrip("0123456789")
            ax.add_patch(Rectangle((start, y), end - start, 0.55, fc=colours[kind], ec="black", lw=0.6))
            ax.text((start + end) / 2, y + 0.27, label, ha="center", va="center", fontsize=6.5)
        makespan = max(end for _, _, end, _ in ops)
        title = "prefetch" if prefetch else "no prefetch (llmarch)"
        ax.text(-0.2, y + 0.27, f"{title}: {lane}", ha="right", va="center", fontsize=8.5)
        if lane == "compute":
            ax.text(makespan + 0.15, y + 0.27, f"step ends at {makespan:g}", va="center", fontsize=8)
    ax.text(0, -0.55, "AG: all-gather a unit's weights (their memory allocated); F, B: its forward, backward, after "
            "which the full weights are freed;\nRS: reduce-scatter its gradients to the shards.  Durations: AG = RS "
            "= 0.6, F = 1, B = 2; each stream runs one operation at a time.", fontsize=7.5, va="center")
    _clean(ax, (-5.6, 16.2), (-0.9, 3.4))
    ax.set_aspect("auto")
    fig.tight_layout()
    return fig


def tensor_parallel_mlp_figure():
    """``Y = GELU(X A) B`` over two ranks: ``A = [A_1, A_2]`` by columns, ``B = [B_1; B_2]`` by rows, one
    all-reduce of the partial outputs (Shoeybi et al., 2019, Figure 3a)."""
    fig, ax = plt.subplots(figsize=(10.5, 3.8))
    _box(ax, 0.8, 2.0, 1.1, 0.8, "$X$\n$(sb, h)$\nboth ranks", "emb", fontsize=8)
    _box(ax, 2.1, 2.0, 0.6, 0.8, "$f$", "plain", fontsize=10)
    _arrow(ax, (1.35, 2.0), (1.8, 2.0))
    for rank, y in ((0, 3.1), (1, 0.9)):
        i = rank + 1
        _arrow(ax, (2.4, 2.0), (3.0, y))
        _box(ax, 3.8, y, 1.5, 0.75, f"$X A_{i}$\n$A_{i}$: $(h, 4h/2)$ columns", "ffn", fontsize=8)
        _arrow(ax, (4.55, y), (4.95, y))
        _box(ax, 5.55, y, 1.1, 0.75, f"GELU\n$Y_{i}$: $(sb, 2h)$", "ffn", fontsize=8)
        _arrow(ax, (6.1, y), (6.5, y))
        _box(ax, 7.3, y, 1.5, 0.75, f"$Y_{i} B_{i}$\n$B_{i}$: $(4h/2, h)$ rows", "ffn", fontsize=8)
        _arrow(ax, (8.05, y), (8.75, 2.0))
        ax.text(5.55, y + 0.55, f"rank {rank}", ha="center", fontsize=8.5, color="#3b7dbf")
    _box(ax, 9.15, 2.0, 0.8, 0.8, "$g$\nall-\nreduce", "new", fontsize=8)
    _arrow(ax, (9.55, 2.0), (9.95, 2.0))
    _box(ax, 10.55, 2.0, 1.0, 0.8, "$Z = \\sum_i Y_i B_i$\n$(sb, h)$", "emb", fontsize=8)
    ax.text(5.5, -0.15, "$f$: identity forward, all-reduce of $\\partial L/\\partial X$ backward;  $g$: all-reduce "
            "forward, identity backward.  GELU acts elementwise, so no communication between the two matmuls.",
            ha="center", fontsize=8)
    _clean(ax, (-0.1, 11.2), (-0.4, 3.8))
    fig.tight_layout()
    return fig


def _check_ring_states_against_library(p: int = 4) -> None:
    """The diagram's final state is :func:`llmarch.parallel.ring_all_reduce`'s: rank ``r`` contributes ``2^r``,
    so a chunk's sum names the set of ranks it holds."""
    from llmarch.parallel import ring_all_reduce, ring_reduce_scatter

    buffers = np.array([[2.0**r] * p for r in range(p)])
    after_rs = ring_reduce_scatter(buffers)
    states = ring_states(p)
    first_gather = states[p - 1][1]
    assert all(after_rs[r, c] == sum(2**m for m in first_gather[r][c]) for r in range(p) for c in range(p))
    final = ring_all_reduce(buffers)
    assert all(final[r, c] == sum(2**m for m in states[-1][1][r][c]) for r in range(p) for c in range(p))
