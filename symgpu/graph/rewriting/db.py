"""The database of rewrite passes: what runs, in which order, selected by tags.

`optdb` holds *passes* at numeric positions (lower runs first). A pass is a graph rewrite
`(fgraph) -> None` or a `RewriteGroup` (node rewrites run together to a fixed point by the
equilibrium driver). Every pass and every node rewrite carries tags (its own name is always
one of them); a mode selects those having one of its include tags (`fast_run` for FAST_RUN
and DebugMode, `fast_compile` for FAST_COMPILE, plus the `optimizer_including` flag) and none
of its exclude tags (the `optimizer_excluding` flag). Excluding a group's name drops the whole
pass; excluding a rewrite's name or tag drops just that rewrite.

Positions (backends register into the gaps):

====  ====================  ======================================================
 pos  pass                  what
====  ====================  ======================================================
   0  merge1                merge equal constants and nodes (fast_run, fast_compile)
   1  canonicalize          algebraic normal form: x*1, x+0, x-x, --x, flatten and
                            collect add/mul, cancel x*y/y, useless dimshuffle/cast/
                            reshape/fill, shape lifting, constant folding (the last
                            also in FAST_COMPILE)
   2  stabilize             numerically stable forms: softplus, sigmoid, log_softmax,
                            stable crossentropies
   3  specialize            cheaper ops: x**2 -> sqr, sum(c*x) -> c*sum(x), log1p...
  15  mixed_bfloat16,       (only under the `mixed_precision` flag or the tag) float32
      mixed_float16         products read half operands (tensor/rewriting/mixed_precision.py)
  20  blas                  dot -> Gemv / Gemm / Dot22, scalings and `w - lr*dot` folded
  40  gpu                   (GPU backend) lift the graph onto the device
  48  merge2                merge what lifting duplicated
  49  fusion                elementwise chains -> one Elemwise{Composite}
  50  cleanup               (free) post-fusion tidying
  75  inplace               in-place variants; attaches the DestroyHandler
  99  gpu_transfer_cancel   (GPU backend) cancel HostFromGpu(GpuFromHost(x)) pairs
 100  merge3                final merge
====  ====================  ======================================================

After `inplace` (75) the graph carries a DestroyHandler: later passes must replace through
`replace_validate` (node rewrites run by the drivers here do), never `fgraph.replace`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from symgpu.graph.rewriting.basic import GraphRewriter, NodeRewriter
from symgpu.graph.rewriting.equilibrium import EquilibriumRewriter
from symgpu.graph.rewriting.merge import MergeRewriter

__all__ = ["optdb", "PassDB", "RewriteGroup", "POSITIONS", "register_canonicalize",
           "register_stabilize", "register_specialize", "canonicalize", "stabilize",
           "specialize"]

#: the documented positions, by pass name
POSITIONS = {
    "merge1": 0, "canonicalize": 1, "stabilize": 2, "specialize": 3, "mixed_precision": 15,
    "blas": 20, "gpu": 40,
    "merge2": 48, "fusion": 49, "cleanup": 50, "inplace": 75, "gpu_transfer_cancel": 99,
    "merge3": 100,
}


def _selected(tags: Iterable[str], include: frozenset, exclude: frozenset,
              require: frozenset = frozenset()) -> bool:
    """Theano's query: a member with an included tag, every required tag (Mode.requiring)
    and no excluded tag."""
    tags = set(tags)
    return bool(tags & include) and require <= tags and not (tags & exclude)


class RewriteGroup:
    """Node rewrites that run together to a fixed point (one equilibrium pass)."""

    def __init__(self, name: str, final_merge: bool = True) -> None:
        self.name = name
        self.final_merge = final_merge
        self.members: list[tuple[NodeRewriter, frozenset]] = []
        self._cache: dict[tuple, EquilibriumRewriter | None] = {}

    def register(self, rewriter: NodeRewriter, *tags: str) -> NodeRewriter:
        """Add a node rewrite; with no tags it runs in FAST_RUN (tag `fast_run`)."""
        if not isinstance(rewriter, NodeRewriter):
            raise TypeError(f"{self.name}: register a NodeRewriter (use @node_rewriter), "
                            f"got {rewriter!r}")
        if any(r is rewriter for r, _ in self.members):
            return rewriter
        tags = frozenset(tags or ("fast_run",)) | {rewriter.name, self.name}
        rewriter.tags |= tags
        self.members.append((rewriter, tags))
        self._cache.clear()
        return rewriter

    def remove(self, rewriter: NodeRewriter | str) -> None:
        """Drop a member (by object or name), e.g. a rewrite a test registered."""
        self.members = [(r, t) for r, t in self.members
                        if r is not rewriter and r.name != rewriter]
        self._cache.clear()

    def names(self) -> list[str]:
        return [r.name for r, _ in self.members]

    def select(self, include: frozenset, exclude: frozenset,
               require: frozenset = frozenset()) -> list[NodeRewriter]:
        return [r for r, tags in self.members if _selected(tags, include, exclude, require)]

    def query(self, include: Iterable[str], exclude: Iterable[str] = (),
              require: Iterable[str] = ()) -> EquilibriumRewriter | None:
        """The equilibrium pass of the selected members (None if none is selected)."""
        key = (frozenset(include), frozenset(exclude), frozenset(require))
        if key not in self._cache:
            chosen = self.select(*key)
            self._cache[key] = (EquilibriumRewriter(chosen, [MergeRewriter()] if self.final_merge else [],
                                                    name=self.name) if chosen else None)
        return self._cache[key]

    def __repr__(self) -> str:
        return f"RewriteGroup({self.name}, {len(self.members)} rewrites)"


@dataclass(order=True)
class _Entry:
    position: float
    seq: int
    name: str = field(compare=False)
    rewrite: Any = field(compare=False)
    tags: frozenset = field(compare=False)


class PassDB:
    """Named passes with tags and positions; `query` picks, in order, those a mode runs."""

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self._seq = 0

    def register(self, name: str, rewrite: Callable | GraphRewriter | RewriteGroup, position: float,
                 *tags: str) -> None:
        """Add a pass; registering a name again replaces the earlier pass of that name."""
        self.entries = [e for e in self.entries if e.name != name]
        self._seq += 1
        self.entries.append(_Entry(float(position), self._seq, name, rewrite,
                                   frozenset(tags) | {name}))
        self.entries.sort()

    def __contains__(self, name: str) -> bool:
        return any(e.name == name for e in self.entries)

    def __getitem__(self, name: str) -> Any:
        for e in self.entries:
            if e.name == name:
                return e.rewrite
        raise KeyError(f"no pass named {name!r}; passes: {', '.join(e.name for e in self.entries)}")

    def query(self, include: Iterable[str], exclude: Iterable[str] = (),
              require: Iterable[str] = ()) -> list[tuple[str, Callable]]:
        """(name, callable(fgraph)) for each selected pass, in position order; `require`d tags
        apply to a group's members too, as Theano's sub-queries."""
        include, exclude, require = frozenset(include), frozenset(exclude), frozenset(require)
        out = []
        for e in self.entries:
            if not _selected(e.tags, include, exclude, require):
                continue
            rw = e.rewrite
            if isinstance(rw, RewriteGroup):
                rw = rw.query(include, exclude, require)
                if rw is None:
                    continue
            out.append((e.name, rw))
        return out

    def describe(self) -> str:
        """One line per pass: position, name, tags (for docs and debugging)."""
        return "\n".join(f"{e.position:6.1f}  {e.name:22s} {', '.join(sorted(e.tags - {e.name}))}"
                         for e in self.entries)


optdb = PassDB()

canonicalize = RewriteGroup("canonicalize")
stabilize = RewriteGroup("stabilize")
specialize = RewriteGroup("specialize")

optdb.register("merge1", MergeRewriter(), POSITIONS["merge1"], "fast_run", "fast_compile", "merge")
optdb.register("canonicalize", canonicalize, POSITIONS["canonicalize"], "fast_run", "fast_compile")
optdb.register("stabilize", stabilize, POSITIONS["stabilize"], "fast_run", "fast_compile")
optdb.register("specialize", specialize, POSITIONS["specialize"], "fast_run", "fast_compile")
optdb.register("merge2", MergeRewriter(), POSITIONS["merge2"], "fast_run", "merge")
optdb.register("merge3", MergeRewriter(), POSITIONS["merge3"], "fast_run", "merge")


def _registrar(group: RewriteGroup):
    def register(rewriter: Any = None, *tags: str):
        if isinstance(rewriter, NodeRewriter):
            return group.register(rewriter, *tags)
        if rewriter is not None and not isinstance(rewriter, str):
            raise TypeError(f"register_{group.name} decorates a NodeRewriter (use @node_rewriter "
                            f"below it); got {rewriter!r}")
        all_tags = ((rewriter,) if rewriter is not None else ()) + tags

        def deco(rw: NodeRewriter) -> NodeRewriter:
            return group.register(rw, *all_tags)
        return deco

    register.__name__ = f"register_{group.name}"
    register.__doc__ = (f"Decorator: add a NodeRewriter to the {group.name} pass, optionally "
                        "with tags (default `fast_run`): `@register_" + group.name +
                        "` or `@register_" + group.name + "('fast_compile', 'fast_run')`.")
    return register


register_canonicalize = _registrar(canonicalize)
register_stabilize = _registrar(stabilize)
register_specialize = _registrar(specialize)
