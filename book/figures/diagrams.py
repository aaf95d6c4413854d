"""Block diagrams drawn with matplotlib at build time (nothing is downloaded).

Each public function returns a ``matplotlib.figure.Figure``:

* :func:`transformer_block_figure` -- a pre-LN decoder block and the GPT stack around it;
* :func:`post_pre_ln_figure` -- post-LN and pre-LN blocks side by side;
* :func:`multi_head_figure` -- split into heads, attend, concatenate, project;
* :func:`architectures_figure` -- encoder-only, decoder-only and encoder-decoder models;
* :func:`kv_cache_figure` -- one decoding step with a key/value cache.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

COLOURS = {
    "attn": "#f4c27a", "ffn": "#9fd3a8", "norm": "#f2e394", "emb": "#c9c9f0",
    "out": "#e8b4c8", "cache": "#bfe0f5", "plain": "#eeeeee", "new": "#f7a8a8",
}


def _box(ax, x, y, w, h, text, colour="plain", fontsize=9):
    """A rounded box centred at (x, y); returns its (bottom, top) y."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=COLOURS.get(colour, colour), ec="black", lw=1))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)
    return y - h / 2, y + h / 2


def _arrow(ax, start, end, style="-|>", lw=1.1, **kw):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, lw=lw,
                                 shrinkA=0, shrinkB=0, **kw))


def _plus(ax, x, y, r=0.13):
    ax.add_patch(plt.Circle((x, y), r, fc="white", ec="black", lw=1))
    ax.text(x, y, "+", ha="center", va="center", fontsize=10)


def _clean(ax, xlim, ylim):
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")


def _residual_sublayer(ax, x, y0, name, colour, norm_first, w=2.0):
    """One residual sub-layer from y0 upwards; returns the y of its output."""
    _arrow(ax, (x, y0), (x, y0 + 0.45))
    if norm_first:                            # x + F(LN(x))
        _box(ax, x, y0 + 0.75, w, 0.5, "LayerNorm", "norm")
        _arrow(ax, (x, y0 + 1.0), (x, y0 + 1.35))
        _box(ax, x, y0 + 1.75, w, 0.7, name, colour)
        _arrow(ax, (x, y0 + 2.1), (x, y0 + 2.57))
        _plus(ax, x, y0 + 2.7)
        ax.plot([x, x - w / 2 - 0.35, x - w / 2 - 0.35], [y0 + 0.2, y0 + 0.2, y0 + 2.7], c="black", lw=1.1)
        _arrow(ax, (x - w / 2 - 0.35, y0 + 2.7), (x - 0.13, y0 + 2.7))
        return y0 + 2.83
    _box(ax, x, y0 + 0.85, w, 0.7, name, colour)  # LN(x + F(x))
    _arrow(ax, (x, y0 + 1.2), (x, y0 + 1.67))
    _plus(ax, x, y0 + 1.8)
    ax.plot([x, x - w / 2 - 0.35, x - w / 2 - 0.35], [y0 + 0.2, y0 + 0.2, y0 + 1.8], c="black", lw=1.1)
    _arrow(ax, (x - w / 2 - 0.35, y0 + 1.8), (x - 0.13, y0 + 1.8))
    _arrow(ax, (x, y0 + 1.93), (x, y0 + 2.3))
    _box(ax, x, y0 + 2.55, w, 0.5, "LayerNorm", "norm")
    return y0 + 2.8


def _block(ax, x, y0, norm_first, attn_name="causal multi-head\nself-attention", cross=False):
    y = _residual_sublayer(ax, x, y0, attn_name, "attn", norm_first)
    if cross:
        y = _residual_sublayer(ax, x, y, "cross-attention", "attn", norm_first)
    return _residual_sublayer(ax, x, y, "feed-forward\n(per position)", "ffn", norm_first)


def transformer_block_figure():
    """A pre-LN decoder block (left) and the decoder-only model built from L of them (right)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(8.5, 5.2), gridspec_kw={"width_ratios": [1.1, 1]})
    ax.text(2.0, -0.35, "$x$ (residual stream in)", ha="center", fontsize=9)
    top = _block(ax, 2.0, -0.1, norm_first=True)
    _arrow(ax, (2.0, top), (2.0, top + 0.4))
    ax.text(2.0, top + 0.55, "residual stream out", ha="center", fontsize=9)
    ax.set_title("one pre-LN block", fontsize=10)
    _clean(ax, (0.0, 4.0), (-0.6, top + 0.9))
    ys = [0.4, 1.5, 2.6, 3.7, 4.8, 5.9]
    names = [("token ids", "plain"), ("token + position embeddings", "emb"), ("block 1", "attn"),
             ("block $L$", "attn"), ("final LayerNorm", "norm"), ("linear head + softmax", "out")]
    for (name, colour), y in zip(names, ys):
        _box(ax2, 2.0, y, 3.0, 0.6, name, colour)
    for a, b in zip(ys[:-1], ys[1:]):
        if a == 2.6:
            ax2.text(2.0, (a + b) / 2, "...", ha="center", va="center", fontsize=12)
        else:
            _arrow(ax2, (2.0, a + 0.3), (2.0, b - 0.3))
    ax2.text(2.0, 6.6, "next-token probabilities", ha="center", fontsize=9)
    _arrow(ax2, (2.0, 6.2), (2.0, 6.5))
    ax2.set_title("the decoder-only model (GPT)", fontsize=10)
    _clean(ax2, (0.2, 3.8), (-0.1, 7.0))
    fig.tight_layout()
    return fig


def post_pre_ln_figure():
    """Post-LN, x -> LN(x + F(x)), and pre-LN, x -> x + F(LN(x)), side by side."""
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 5.6))
    for ax, norm_first, title in ((axes[0], False, "post-LN (original Transformer, BERT)"),
                                  (axes[1], True, "pre-LN (GPT-2 and later)")):
        ax.text(2.0, -0.35, "$x$", ha="center", fontsize=10)
        top = _block(ax, 2.0, -0.1, norm_first=norm_first, attn_name="multi-head\nattention")
        _arrow(ax, (2.0, top), (2.0, top + 0.35))
        ax.set_title(title, fontsize=10)
        note = ("every sub-layer's output is\nnormalised: the stream has scale 1"
                if not norm_first else "only sub-layer inputs are normalised:\nan identity path runs end to end")
        ax.text(2.0, top + 0.75, note, ha="center", fontsize=8.5, va="center")
        _clean(ax, (0.0, 4.0), (-0.6, 6.9))
    fig.tight_layout()
    return fig


def multi_head_figure(n_heads=4):
    """X -> Q, K, V -> split into heads -> attention per head -> concatenate -> W_O."""
    fig, ax = plt.subplots(figsize=(9.5, 4.6))
    _box(ax, 0.9, 2.2, 1.3, 0.8, "$X$\n$T \\times d_\\mathrm{model}$", "emb")
    for i, (name, y) in enumerate((("$Q = XW_Q$", 3.6), ("$K = XW_K$", 2.2), ("$V = XW_V$", 0.8))):
        _arrow(ax, (1.55, 2.2), (2.4, y))
        _box(ax, 3.2, y, 1.5, 0.6, name, "plain")
    ax.text(3.2, 4.3, "$T \\times H d_\\mathrm{head}$ each", ha="center", fontsize=8.5)
    ax.text(4.2, 4.62, "columns $(h-1)d_\\mathrm{head}+1..h\\,d_\\mathrm{head}$", ha="left", fontsize=8)
    ys = [3.9 - i * 1.05 for i in range(n_heads)]
    _box(ax, 4.55, 2.2, 0.7, 3.6, "split\ninto\n$H$\nheads", "plain", fontsize=8.5)
    for y_src in (3.6, 2.2, 0.8):
        _arrow(ax, (3.95, y_src), (4.2, y_src))
    for h, y in enumerate(ys):
        _arrow(ax, (4.9, y), (5.55, y))
        ax.text(5.22, y + 0.12, f"$Q_{h + 1},K_{h + 1},V_{h + 1}$", ha="center", fontsize=6.5)
        _box(ax, 6.4, y, 1.7, 0.7, f"head {h + 1}:\nsoftmax$(Q_hK_h^\\top/\\sqrt{{d_\\mathrm{{head}}}})V_h$",
             "attn", fontsize=7.5)
        _arrow(ax, (7.25, y), (8.05, 2.3))
    _box(ax, 8.6, 2.3, 1.1, 3.4, "concat\n$T \\times H d_\\mathrm{head}$", "plain", fontsize=8.5)
    _arrow(ax, (9.15, 2.3), (9.65, 2.3))
    _box(ax, 10.35, 2.3, 1.3, 0.8, "$\\cdot\\, W_O$\n$T \\times d_\\mathrm{model}$", "out")
    ax.text(6.4, -0.3, f"$H = {n_heads}$ heads of width $d_\\mathrm{{head}} = d_\\mathrm{{model}}/H$, "
            "each with its own $T \\times T$ attention pattern", ha="center", fontsize=9)
    _clean(ax, (0.1, 11.1), (-0.6, 4.85))
    fig.tight_layout()
    return fig


def architectures_figure():
    """Encoder-only (BERT), decoder-only (GPT) and encoder-decoder (original Transformer, T5)."""
    fig, axes = plt.subplots(1, 3, figsize=(11, 4.6))
    specs = [
        ("encoder-only (BERT)", [("bidirectional\nself-attention + FFN", "attn")], "every token\nsees every token"),
        ("decoder-only (GPT, Llama)", [("causal\nself-attention + FFN", "attn")], "token $t$ sees\ntokens $\\leq t$"),
    ]
    for ax, (title, blocks, note) in zip(axes[:2], specs):
        _box(ax, 2.0, 0.5, 2.6, 0.55, "embeddings", "emb")
        _arrow(ax, (2.0, 0.78), (2.0, 1.25))
        _box(ax, 2.0, 2.0, 2.6, 1.4, blocks[0][0] + "\n$\\times L$", blocks[0][1])
        _arrow(ax, (2.0, 2.7), (2.0, 3.2))
        _box(ax, 2.0, 3.5, 2.6, 0.55, "output head", "out")
        ax.text(2.0, 4.3, note, ha="center", va="center", fontsize=8.5)
        ax.set_title(title, fontsize=10)
        _clean(ax, (0.4, 3.6), (0.0, 4.8))
    ax = axes[2]
    for x, label, blk in ((1.2, "source", "bidirectional\nself-attn + FFN\n$\\times L$"),
                          (3.6, "target (shifted)", "causal self-attn\n+ cross-attn + FFN\n$\\times L$")):
        _box(ax, x, 0.5, 1.9, 0.55, f"{label}\nembeddings", "emb", fontsize=8)
        _arrow(ax, (x, 0.78), (x, 1.25))
        _box(ax, x, 2.0, 1.9, 1.4, blk, "attn", fontsize=8)
    _arrow(ax, (2.15, 2.3), (2.65, 2.3))
    ax.text(2.4, 2.55, "K, V", ha="center", fontsize=8)
    _arrow(ax, (3.6, 2.7), (3.6, 3.2))
    _box(ax, 3.6, 3.5, 1.9, 0.55, "output head", "out")
    ax.text(1.2, 3.2, "encoder", ha="center", fontsize=9)
    ax.text(3.6, 4.3, "decoder queries attend\nto the encoder's output", ha="center", va="center", fontsize=8.5)
    ax.set_title("encoder-decoder (Transformer, T5)", fontsize=10)
    _clean(ax, (0.1, 4.7), (0.0, 4.8))
    fig.tight_layout()
    return fig


def kv_cache_figure(n_cached=5):
    """One decoding step: the new token's query attends to cached keys and values plus its own."""
    fig, ax = plt.subplots(figsize=(9.5, 3.9))
    w = 0.62
    for row, (name, y) in enumerate((("keys", 2.6), ("values", 1.5))):
        ax.text(-0.2, y, name, ha="right", va="center", fontsize=9)
        for i in range(n_cached + 1):
            new = i == n_cached
            _box(ax, 0.4 + i * 0.8, y, w, 0.6, f"${name[0]}_{{{i}}}$", "new" if new else "cache", fontsize=9)
    ax.add_patch(FancyBboxPatch((0.0, 1.05), n_cached * 0.8 - 0.05, 1.9, boxstyle="round,pad=0.05",
                                fc="none", ec="#3b7dbf", lw=1.5, ls="--"))
    ax.text((n_cached * 0.8) / 2 - 0.05, 3.25, f"cache: computed at earlier steps, kept ($t = 0..{n_cached - 1}$)",
            ha="center", fontsize=8.5, color="#3b7dbf")
    xq = 0.4 + n_cached * 0.8
    _box(ax, xq, 0.3, w, 0.55, f"$x_{{{n_cached}}}$", "emb", fontsize=9)
    ax.text(xq + 0.5, 0.3, "only the new token\nis projected", fontsize=8, va="center")
    _arrow(ax, (xq, 0.58), (xq, 1.2))
    ax.plot([xq + 0.31, xq + 1.9], [0.3, 0.3], c="black", lw=1.1)
    _arrow(ax, (xq + 1.9, 0.3), (xq + 1.9, 1.75))
    ax.plot([xq - 0.45, xq - 0.45], [0.3, 2.6], c="black", lw=1.1)
    ax.plot([xq - 0.31, xq - 0.45], [0.3, 0.3], c="black", lw=1.1)
    _arrow(ax, (xq - 0.45, 2.6), (xq - 0.31, 2.6))
    _box(ax, xq + 1.9, 2.05, 1.3, 0.6, f"$q_{{{n_cached}}}$", "new")
    ax.text(xq + 1.9, 2.65, "query of the new token", ha="center", fontsize=8)
    for i in range(n_cached + 1):
        _arrow(ax, (xq + 1.25, 2.05), (0.4 + i * 0.8, 2.3), color="gray", lw=0.6, style="-")
    _box(ax, xq + 4.0, 2.05, 2.2, 0.9, f"softmax over {n_cached + 1} keys,\nweighted sum of values\n"
         f"$\\to$ output at position {n_cached}", "attn", fontsize=8)
    _arrow(ax, (xq + 2.55, 2.05), (xq + 2.9, 2.05))
    ax.text(xq + 4.0, 0.5, "step $t$ costs $O(t\\,d)$ instead of $O(t^2 d)$;\nthen $k_t, v_t$ join the cache",
            ha="center", fontsize=8.5)
    _clean(ax, (-1.0, xq + 5.3), (-0.1, 3.5))
    fig.tight_layout()
    return fig
