"""Draw one traced decoding step: the draft tree, coloured by drafter, accepted path highlighted."""

from __future__ import annotations

from pathlib import Path

#: One colour per drafter index (cheapest first); the root is grey.
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860")
ROOT_COLOUR = "#9E9E9E"
#: the narrowest figure, in inches: room for the title and the legend right of the tree
MIN_WIDTH = 9.0
#: the image formats `render_step` writes, by file suffix
FORMATS = (".png", ".svg", ".pdf")


def check_image_path(path: Path, what: str = "--out") -> Path:
    """`path` names an image file `render_step` can write (a suffix of :data:`FORMATS`, not a
    folder, in a folder that exists or can be created, and written); otherwise an
    `ArgumentError` naming `what`, before anything is drawn. Nothing is created."""
    from treegraft.core.errors import ArgumentError
    from treegraft.core.inputs import check_file_folder

    accepted = ", ".join(FORMATS)
    if path.is_dir():
        raise ArgumentError(
            f"{what}: {path} is a directory; expected an image file name ending in {accepted}"
        )
    if path.suffix.lower() not in FORMATS:
        got = f"format {path.suffix!r}" if path.suffix else "no format suffix"
        raise ArgumentError(f"{what}: {path} has {got}; expected a file name ending in {accepted}")
    return check_file_folder(path, what, create=False)


def layout(nodes: list[dict]) -> dict[int, tuple[float, float]]:
    """(x = depth, y = row) for every node: leaves get consecutive rows, parents sit at their children's mean.

    `nodes` may be a subtree holding the root (the nodes drawn): only they take rows. Walks the
    tree with an explicit stack, so a chain thousands of nodes deep lays out too."""
    by_id = {n["id"]: n for n in nodes}
    children: dict[int, list[int]] = {i: [] for i in by_id}
    for n in nodes:
        if n["parent"] in children:
            children[n["parent"]].append(n["id"])
    for kids in children.values():
        kids.sort(key=lambda c: -_score(by_id[c]))
    pos: dict[int, tuple[float, float]] = {}
    next_row = 0.0
    stack = [(nodes[0]["id"], False)]
    while stack:
        node, placed_kids = stack.pop()
        kids = children[node]
        if not placed_kids:  # first visit: place the children (best first), then come back
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(kids))
            continue
        if kids:
            y = sum(pos[c][1] for c in kids) / len(kids)
        else:
            y, next_row = next_row, next_row + 1.0
        pos[node] = (float(by_id[node]["depth"]), y)
    return pos


def _score(node: dict) -> float:
    s = node["score"]
    return s if s == s and s != float("-inf") else -1e30


def label(node: dict) -> str:
    """Token text if known (whitespace made visible), else the token id."""
    text = node.get("text")
    if text is None:
        return str(node["token"])
    return plain(repr(text)[1:-1].replace(" ", "\u2423")[:12] or "\u2205")


def plain(text: str) -> str:
    """`text` drawn as written: each `$` escaped, so a token such as `$x$` or `$$` is not read
    as matplotlib math (which drew it as a formula, or failed the whole render)."""
    return text.replace("$", r"\$")


def render_step(record: dict, out: Path, *, show_pruned: bool = True) -> Path:
    """Write an image (PNG, SVG or PDF, by `out`'s suffix) of one step record (as written by
    `TraceWriter`, read by `load_step`); a record that is not one, or an `out` that is no path,
    is an `ArgumentError` (an `IndexError` or `KeyError` from deep in the drawing once)."""
    from treegraft.core.errors import ArgumentError
    from treegraft.core.inputs import check_path
    from treegraft.core.trace import step_problem
    from treegraft.viz import figure

    check_path("render_step", "out", out)
    if problem := step_problem(record):
        raise ArgumentError(f"render_step: record: not a trace step: {problem}")
    out = check_image_path(Path(out), "render_step: out")
    nodes = shown_nodes(record["nodes"], show_pruned)
    keep_ids = {n["id"] for n in nodes}
    pos = layout(nodes)  # rows for the drawn nodes only: hidden ones leave no gaps
    rows = max((y for _, y in pos.values()), default=0) + 1
    depth = max(n["depth"] for n in nodes)
    # never narrower than the title and the legend beside the tree need (a shallow tree too)
    fig = figure(max(2.2 + 1.9 * depth, MIN_WIDTH), 0.8 + 0.42 * rows)
    ax = fig.subplots()
    _draw_edges(ax, [n for n in nodes if n["parent"] in keep_ids], pos)
    _draw_nodes(ax, nodes, pos)
    ax.set_xlabel("depth")
    ax.set_xticks(range(depth + 1))
    ax.margins(x=0.08, y=0.15)
    ax.set_yticks([])
    ax.invert_yaxis()
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.legend(
        handles=legend_handles(record.get("drafters") or [], nodes),
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        frameon=False,
        fontsize=8,
    )
    calls = ", ".join(str(c) for c in record.get("calls", []))
    ax.set_title(title(record, calls), fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130, bbox_inches="tight")
    return out


def shown_nodes(nodes: list[dict], show_pruned: bool) -> list[dict]:
    """The nodes to draw: all, or (`--hide-pruned`) the kept ones whose ancestors are all kept;
    the root always, even where a step file marks it pruned."""
    kept: set[int] = set()
    for n in nodes:  # parents are listed before their children
        if n["parent"] < 0 or (n["kept"] and n["parent"] in kept):
            kept.add(n["id"])
    return [n for n in nodes if show_pruned or n["id"] in kept]


def legend_handles(names: list[str], nodes: list[dict]) -> list:
    """One entry per drafter, then the accepted path, and the rescored and pruned markers
    where such nodes are drawn."""
    from matplotlib.lines import Line2D

    from treegraft.viz import short

    handles = [
        Line2D([], [], marker="o", ls="", color=_colour(i), label=plain(short(f"{i}: {name}")))
        for i, name in enumerate(names)
    ]
    handles.append(Line2D([], [], color="black", lw=2.6, label="accepted path"))
    if any(n["scorer"] != n["proposer"] and n["parent"] >= 0 for n in nodes):
        label = "rescored (diamond: by that drafter)"
        handles.append(Line2D([], [], marker="D", ls="", color="#777777", ms=5, label=label))
    if not all(n["kept"] for n in nodes[1:]):
        label = "pruned before verification"
        handles.append(Line2D([], [], marker="o", ls="", mfc="white", mec="#999999", label=label))
    return handles


def accepted_count(record: dict) -> int:
    """Draft tokens the verifier accepted at this step; a trace written before the record had
    `accepted` counts its emitted tokens less the bonus (too few where a stop cut them)."""
    return record.get("accepted", len(record["accepted_tokens"]) - 1)


def title(record: dict, calls: str) -> str:
    """The step, its drafter calls and acceptance, and, on the last step, why decoding ended
    (a stop can emit fewer tokens than were accepted)."""
    text = (
        f"step {record['step']} · drafter per layer [{calls}] · accepted {accepted_count(record)}"
    )
    finish = record.get("finish_reason")
    if finish:
        text += f" · ended by {finish}, emitted {len(record['accepted_tokens'])}"
    return text


def _draw_edges(ax, nodes: list[dict], pos: dict[int, tuple[float, float]]) -> None:
    """Each node's edge to its parent, in two collections (the accepted path drawn heavy)."""
    from matplotlib.collections import LineCollection

    for accepted, colour, width in ((False, "#BBBBBB", 0.9), (True, "black", 2.6)):
        segments = [(pos[n["parent"]], pos[n["id"]]) for n in nodes if n["accepted"] == accepted]
        ax.add_collection(LineCollection(segments, colors=colour, linewidths=width, zorder=1))


def _draw_nodes(ax, nodes: list[dict], pos: dict[int, tuple[float, float]]) -> None:
    """All the nodes in one scatter (one per rescoring marker), then their labels: a tree of
    thousands of nodes draws in seconds, not one artist per marker."""
    colours = [ROOT_COLOUR if n["parent"] < 0 else _colour(n["proposer"]) for n in nodes]
    xs, ys = zip(*(pos[n["id"]] for n in nodes), strict=True)
    ax.scatter(
        xs,
        ys,
        s=160,
        c=[c if n["kept"] else "white" for n, c in zip(nodes, colours, strict=True)],
        edgecolors=["black" if n["accepted"] else c for n, c in zip(nodes, colours, strict=True)],
        linewidths=[2.2 if n["accepted"] else 1.2 for n in nodes],
        zorder=3,
    )
    rescored = [n for n in nodes if n["scorer"] != n["proposer"] and n["parent"] >= 0]
    if rescored:
        ax.scatter(
            [pos[n["id"]][0] for n in rescored],
            [pos[n["id"]][1] for n in rescored],
            s=30,
            c=[_colour(n["scorer"]) for n in rescored],
            zorder=4,
            marker="D",
        )
    for n in nodes:
        _label_node(ax, n, pos[n["id"]])


def _colour(drafter: int) -> str:
    return PALETTE[drafter % len(PALETTE)]


def _label_node(ax, n: dict, xy: tuple[float, float]) -> None:
    """The token above the edge leaving the node rightwards, its score below (on the edge, a
    chain's black line struck the text through)."""
    x, y = xy
    ax.annotate(
        label(n),
        (x, y),
        xytext=(8, 2),
        textcoords="offset points",
        va="bottom",
        fontsize=7.5,
        family="monospace",
    )
    if n["parent"] >= 0 and n["score"] != float("-inf"):
        ax.annotate(
            f"{n['score']:.2f}",
            (x, y),
            xytext=(8, -2),
            textcoords="offset points",
            va="top",
            fontsize=6,
            color="#666666",
        )
