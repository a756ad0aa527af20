#!/usr/bin/env python3
"""Flame graphs from `perf script` output, with no tool beyond Python.

    perf record -e cpu-clock -F 997 --call-graph dwarf -p PID -o perf.data -- sleep 5
    perf script -i perf.data | bench/flamegraph.py --title "..." > graph.svg
    perf script -i perf.data | bench/flamegraph.py --folded > stacks.txt

Each sample's stack becomes one line of frames from the thread's root to the leaf (function
names without offsets; a frame perf could not name is its library's name in brackets). The SVG
is the usual icicle turned upside down: the root at the bottom, a frame's width its share of the
samples, frames narrower than --min-percent left out (their samples still count in the parents).
Hovering a frame shows its name, samples and share.
"""
import argparse
import collections
import html
import re
import sys

FRAME = re.compile(r"^\s*[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")


def stacks(lines):
    """Yields (frames root-first, weight) per sample of `perf script` output."""
    frames = []
    in_sample = False
    for line in lines:
        if not line.strip():
            if in_sample and frames:
                yield list(reversed(frames)), 1
            frames, in_sample = [], False
            continue
        if not in_sample:
            in_sample = True  # the sample's header line: comm tid time: period event:
            continue
        m = FRAME.match(line)
        if not m:
            continue
        sym, dso = m.group(1), m.group(2)
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        if sym in ("[unknown]", ""):
            sym = "[" + dso.rsplit("/", 1)[-1] + "]"
        if frames and frames[-1] == sym:  # an inlined frame perf repeats
            continue
        frames.append(sym)
    if in_sample and frames:
        yield list(reversed(frames)), 1


def short(name, limit=160):
    """Template arguments dropped (they make C++ names unreadable), then cut to `limit`."""
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            depth += 1
            if depth == 1:
                out.append("<>")
            continue
        if ch == ">" and depth > 0:
            depth -= 1
            continue
        if depth == 0:
            out.append(ch)
    s = "".join(out)
    return s if len(s) <= limit else s[: limit - 3] + "..."


class Node:
    __slots__ = ("name", "count", "children")

    def __init__(self, name):
        self.name, self.count, self.children = name, 0, {}


def build(folded):
    root = Node("all")
    for frames, weight in folded:
        root.count += weight
        node = root
        for f in frames:
            node = node.children.setdefault(f, Node(f))
            node.count += weight
    return root


def color(name):
    h = 0
    for ch in name:
        h = (h * 31 + ord(ch)) & 0xFFFFFFFF
    if name.startswith("retrybudget::") or "retrybudget" in name:
        return "rgb(80,%d,200)" % (120 + h % 80)  # this project's code: blue
    if name.startswith("[k]") or name.endswith("_[k]") or "kernel" in name:
        return "rgb(200,%d,80)" % (150 + h % 60)
    return "rgb(%d,%d,60)" % (205 + h % 50, 80 + h % 120)


def svg(root, title, min_percent, width=1200, row=16):
    rects = []
    depth_max = 0

    def walk(node, x, depth):
        nonlocal depth_max
        depth_max = max(depth_max, depth)
        rects.append((node, x, depth))
        cx = x
        for child in sorted(node.children.values(), key=lambda c: c.name):
            if child.count * 100.0 / root.count >= min_percent:
                walk(child, cx, depth + 1)
            cx += child.count

    walk(root, 0, 0)
    height = (depth_max + 1) * row + 40
    scale = (width - 20) / max(1, root.count)
    out = [
        '<?xml version="1.0" standalone="no"?>',
        f'<svg version="1.1" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" '
        'font-family="Verdana" font-size="11">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#f8f8f8"/>',
        f'<text x="10" y="20" font-size="14">{html.escape(title)} ({root.count} samples)</text>',
    ]
    for node, x, depth in rects:
        w = node.count * scale
        y = height - (depth + 1) * row - 4
        name = short(node.name)
        pct = node.count * 100.0 / root.count
        label = html.escape(name)
        out.append(
            f'<g><title>{label} ({node.count} samples, {pct:.2f}%)</title>'
            f'<rect x="{10 + x * scale:.2f}" y="{y}" width="{max(w - 0.5, 0.1):.2f}" '
            f'height="{row - 1}" fill="{color(node.name)}" rx="2"/>')
        chars = int(w / 7)
        if chars >= 4:
            text = name if len(name) <= chars else name[: chars - 2] + ".."
            out.append(f'<text x="{10 + x * scale + 3:.2f}" y="{y + row - 4}">'
                       f'{html.escape(text)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--title", default="flame graph")
    ap.add_argument("--min-percent", type=float, default=0.3,
                    help="leave out frames narrower than this share of the samples")
    ap.add_argument("--folded", action="store_true",
                    help="print the folded stacks (frame;frame;... count) instead of an SVG")
    args = ap.parse_args()
    folded = collections.Counter()
    for frames, weight in stacks(sys.stdin):
        folded[tuple(frames)] += weight
    if not folded:
        sys.exit("flamegraph.py: no samples with a stack on stdin (perf script output expected)")
    if args.folded:
        for frames, n in folded.most_common():
            print(";".join(frames), n)
        return
    sys.stdout.write(svg(build(folded.items()), args.title, args.min_percent))


if __name__ == "__main__":
    main()
