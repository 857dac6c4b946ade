"""symgpu.d3viz (Theano's theano.d3viz): the page's data and HTML, the dot writer, the layout,
and the page itself in headless Chromium (tests marked ``browser``; skipped, with the reason,
where no browser starts: .ci/run installs Debian's chromium and chromium-driver)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function, shared
from symgpu.compile.profiling import ProfileStats
from symgpu.config import config
from symgpu.d3viz import PyDotFormatter, d3viz, d3write, html_page, page_data
from symgpu.d3viz.layout import count_crossings, layered_layout

EVIL = "</script><script>alert(1)</script>"
RNG = np.random.default_rng(3)


def embedded(text: str) -> dict:
    """The JSON block of a written page, as the page's script reads it."""
    m = re.search(r'<script type="application/json" id="d3viz-data">(.*?)</script>', text, re.S)
    assert m, "no data block"
    return json.loads(m.group(1))


def mlp(profile: bool = True, calls: int = 3, name: str = "mlp_train"):
    """A small MLP's training step (the graph a user would look at)."""
    fx = config.floatX
    x, y = T.matrix("x"), T.ivector("y")
    W1 = shared(RNG.normal(size=(6, 8)).astype(fx), name="W1")
    b1 = shared(np.zeros(8, fx), name="b1")
    W2 = shared(RNG.normal(size=(8, 3)).astype(fx), name="W2")
    h = T.tanh(T.dot(x, W1) + b1)
    p = T.nnet.softmax(T.dot(h, W2))
    cost = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
    params = [W1, b1, W2]
    grads = T.grad(cost, params)
    f = function([x, y], cost, updates=[(q, q - 0.1 * g) for q, g in zip(params, grads)],
                 profile=ProfileStats(atexit_print=False) if profile else False, name=name)
    for _ in range(calls):
        f(RNG.normal(size=(16, 6)).astype(fx), RNG.integers(0, 3, 16).astype("int32"))
    return f


def ofg_function():
    from symgpu.builders import OpFromGraph
    a, b = T.dmatrices("a", "b")
    op = OpFromGraph([a, b], [a * b + a], inline=False)
    x, y = T.dmatrices("x", "y")
    return function([x, y], op(x, y) - op(y, x))


# ============================================================================ the data

def test_every_node_and_variable_is_drawn_with_its_kind():
    x = T.vector("x")
    w = shared(np.ones(3), name="w")
    out = T.exp(x * w) + np.arange(3.0)  # an array constant stays an input of the fused op
    f = function([x], [out, x.sum()], updates=[(w, w * 2)])
    fg = f.maker.fgraph
    g = page_data(f)["graphs"][0]
    kinds = [n["kind"] for n in g["nodes"]]
    applies = [n for n in g["nodes"] if n["kind"] in ("cpu", "gpu", "transfer")]
    assert len(applies) == len(fg.apply_nodes)
    assert {n["op"] for n in applies} == {type(a.op).__name__ for a in fg.apply_nodes}
    assert kinds.count("output") == len(fg.outputs) == 3
    assert kinds.count("input") == 1 and kinds.count("shared") == 1
    consts = {n["label"] for n in g["nodes"] if n["kind"] == "constant"}
    leaf_consts = {c for a in fg.apply_nodes for c in a.inputs
                   if c.owner is None and c not in fg.inputs}
    assert len([n for n in g["nodes"] if n["kind"] == "constant"]) == len(leaf_consts)
    assert "update of w" in {n["label"] for n in g["nodes"]}
    ids = {n["id"] for n in g["nodes"]}
    assert len(ids) == len(g["nodes"])
    for e in g["edges"]:  # every edge joins drawn nodes and points down the page
        assert e["src"] in ids and e["dst"] in ids
        assert e["points"][0][1] < e["points"][-1][1]
    assert consts  # the arange is a constant box


def test_a_graph_of_variables_is_drawn_too():
    x, y = T.dmatrices("x", "y")
    z = (x + y).sum()
    data = page_data([z])
    assert data["profile"] is None
    ops = {n["op"] for n in data["graphs"][0]["nodes"] if n["op"]}
    assert "Elemwise" in ops and len(ops) == 2
    assert page_data(z.owner)["graphs"][0]["nodes"]
    with pytest.raises(TypeError, match="d3viz draws"):
        page_data(42)


def test_a_malicious_name_stays_text(tmp_path):
    x = T.vector(EVIL)
    f = function([x], T.exp(x), name=EVIL)
    path = d3viz(f, str(tmp_path / "evil.html"))
    text = open(path, encoding="utf-8").read()
    assert "<script>alert" not in text
    assert text.count("</script") == 2  # the data block's end and the script's end: no more
    assert "&lt;/script&gt;" in text.split("</title>")[0]  # the title is escaped markup
    labels = {n["label"] for n in embedded(text)["graphs"][0]["nodes"]}
    assert EVIL in labels  # the name itself survives, as data


def test_profiled_function_gives_times_and_shapes_of_the_last_call(tmp_path):
    f = mlp()
    data = page_data(f)
    g = data["graphs"][0]
    assert g["profiled"] and g["shapes"] == "last call"
    assert data["profile"]["calls"] == 3
    applies = [n for n in g["nodes"] if n["op"]]
    assert all(n["time"] is not None and n["time"] >= 0 for n in applies)
    total = sum(f.profile.apply_time.values())
    slow = max(f.profile.apply_time, key=f.profile.apply_time.get)
    top = max(applies, key=lambda n: n["time"])
    assert top["heat"] == 1.0 and top["op"] == type(slow.op).__name__
    assert abs(sum(n["share"] for n in applies) - total / f.profile.fct_call_time) < 1e-6
    details = dict(top["details"])
    assert "time per call" in details and details["calls"] == "3"
    # the slowest node is drawn bigger than an unprofiled node with the same label
    plain = page_data(f.maker.fgraph)["graphs"][0]
    same = next(n for n in plain["nodes"] if n["id"] == top["id"])
    assert top["w"] > same["w"] and same["time"] is None
    shapes = " ".join(v for n in applies for k, v in n["details"] if k.startswith("output"))
    assert "shape=(16, 3)" in shapes  # the softmax's output at the last call


def test_static_shapes_without_a_profile():
    x = T.dmatrix("x")
    f = function([x], [T.ones((3, 4)) * 2.0, x.T, T.alloc(x.sum(), 3, x.shape[0])])
    g = page_data(f)["graphs"][0]
    assert g["shapes"] == "static"
    shapes = {n["label"]: dict(n["details"]).get("shape (static)", dict(n["details"]).get("shape"))
              for n in g["nodes"] if n["kind"] != "cpu"}
    assert shapes["x"] == "(?, ?)"  # a matrix input: both dims unknown
    assert shapes["output 0"] == "(3, 4)"  # folded to a constant: its value's shape
    assert shapes["output 2"] == "(3, ?)"  # from Alloc's shape rule


def test_gpu_and_transfer_nodes_get_their_colours():
    from symgpu.gpu.placement.rewriting import virtual_context
    from symgpu.printing import DOT_COLORS
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.matrix("x")
        w = shared(np.ones((4, 4), "float32"), name="w")
        f = function([x], T.tanh(T.dot(x, w)).sum())
        g = page_data(f)["graphs"][0]
    kinds = {n["kind"]: n for n in g["nodes"]}
    assert {"gpu", "transfer"} <= set(kinds)
    assert kinds["gpu"]["color"] == DOT_COLORS["gpu"]
    assert kinds["transfer"]["color"] == DOT_COLORS["transfer"]
    assert dict(kinds["gpu"]["details"])["device"].startswith("gpu")


def test_inner_graphs_are_sections_of_their_own():
    f = ofg_function()
    graphs = page_data(f)["graphs"]
    holders = [n for n in graphs[0]["nodes"] if n["inner"]]
    assert holders and len(graphs) >= 2
    by_id = {g["id"]: g for g in graphs}
    for h in holders:
        inner = by_id[h["inner"][0][0]]
        assert inner["parent"][1] in {n["id"] for n in graphs[0]["nodes"]}
        assert any(n["op"] == "Elemwise" for n in inner["nodes"])


def test_loops_and_branches_show_their_bodies():
    from symgpu.ifelse import ifelse
    x = T.dvector("x")
    ys, _ = symgpu.scan(lambda v, acc: acc + v, sequences=[x], outputs_info=[T.zeros_like(x[0])])
    c = T.dscalar("c")
    f = function([x, c], ifelse(T.gt(c, 0), ys[-1], -ys[-1]), mode="FAST_COMPILE")
    graphs = page_data(f)["graphs"]
    titles = " ".join(g["title"] for g in graphs[1:])
    assert "body" in titles and "then" in titles and "else" in titles, titles


def test_page_is_self_contained_and_copy_deps_changes_nothing(tmp_path):
    f = mlp(profile=False, calls=0)
    a = d3viz(f, str(tmp_path / "a.html"))
    b = d3viz(f, str(tmp_path / "sub" / "b.html"), copy_deps=False)
    text = open(a, encoding="utf-8").read()
    assert text == open(b, encoding="utf-8").read()
    assert sorted(os.listdir(tmp_path)) == ["a.html", "sub"]  # no d3viz/ folder of copies
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(http", text)
    urls = set(re.findall(r"https?://[^\s\"')]+", text))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    assert "default-src 'none'" in text  # the page may not fetch anything


def test_the_module_is_callable_as_theano_s_package_attribute(tmp_path):
    f = ofg_function()
    import symgpu.d3viz as d3v
    p1 = d3viz(f, str(tmp_path / "1.html"))
    p2 = d3v.d3viz(f, str(tmp_path / "2.html"))
    p3 = d3viz.d3viz(f, str(tmp_path / "3.html"), True, False)  # compact=False, positionally
    texts = [open(p, encoding="utf-8").read() for p in (p1, p2, p3)]
    assert texts[0] == texts[1] and texts[2] != texts[0]
    assert d3viz.d3write is d3write


def test_import_symgpu_does_not_load_d3viz():
    code = ("import sys, symgpu; assert 'symgpu.d3viz' not in sys.modules; "
            "sys.modules['theano'] = symgpu; import theano.d3viz as d3v; "
            "from theano.d3viz.formatting import PyDotFormatter; print(d3v.d3viz.__name__)")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "symgpu.d3viz.d3viz"


# ============================================================================ dot

_STMT = re.compile(r'^(\w+)(?: -> (\w+))? \[(.*)\];$|^(\w+) -> (\w+);$')
_ATTR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"(?:, |$)')


def parse_dot(text: str) -> tuple[dict, list, int]:
    """A strict reader of what DotGraph writes: nodes (name -> attrs), edges, clusters."""
    lines = [ln.strip() for ln in text.strip().splitlines()]
    assert lines[0].startswith("digraph ") and lines[0].endswith("{") and lines[-1] == "}"
    depth, nodes, edges, clusters = 0, {}, [], 0
    for ln in lines:
        if ln.endswith("{"):
            depth += 1
            clusters += ln.startswith("subgraph cluster_")
            continue
        if ln == "}":
            depth -= 1
            continue
        if re.match(r"^(graph|node|edge) \[.*\];$|^label=\".*\";$", ln):
            continue
        m = _STMT.match(ln)
        assert m, f"not a dot statement: {ln!r}"
        if m.group(4):
            edges.append((m.group(4), m.group(5)))
            continue
        attrs = dict(_ATTR.findall(m.group(3)))
        assert "".join(f'{k}="{v}", ' for k, v in attrs.items())[:-2] == m.group(3)
        if m.group(2):
            edges.append((m.group(1), m.group(2)))
        else:
            nodes[m.group(1)] = attrs
    assert depth == 0
    return nodes, edges, clusters


def test_d3write_writes_parseable_dot(tmp_path):
    x = T.dvector(EVIL + ' "quoted" \\ back')
    f = function([x], T.exp(x).sum(), profile=ProfileStats(atexit_print=False))
    f(np.ones(3))
    path = d3write(f, str(tmp_path / "g.dot"))
    nodes, edges, _ = parse_dot(open(path, encoding="utf-8").read())
    assert all(a in nodes and b in nodes for a, b in edges)
    types_ = [a["node_type"] for a in nodes.values()]
    assert types_.count("apply") == len(f.maker.fgraph.apply_nodes)
    assert types_.count("output") == 1 and types_.count("input") == 1
    assert all("profile" in a for a in nodes.values() if a["node_type"] == "apply")
    if shutil.which("dot"):
        run = subprocess.run(["dot", "-Tplain", path], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr


def test_pydotformatter_has_theano_s_interface(tmp_path):
    f = ofg_function()
    graph = PyDotFormatter()(f)
    apply_nodes = [n for n in graph.get_nodes() if n.get_attributes()["node_type"] == "apply"]
    assert len(apply_nodes) == len(f.maker.fgraph.apply_nodes)
    subs = graph.get_subgraph_list()
    assert subs and all(s.get_name().startswith("cluster_") for s in subs)
    assert any(n.get_attributes().get("subg") for n in apply_nodes)
    nodes, edges, clusters = parse_dot(graph.create_dot().decode())
    assert clusters == len(subs)
    full = PyDotFormatter(compact=False)(f)
    assert len(full.get_nodes()) > len(graph.get_nodes())  # intermediate variables drawn
    assert graph.write_dot(str(tmp_path / "x" / "g.dot")).endswith("g.dot")


# ============================================================================ layout

def test_layout_points_every_edge_down_without_overlaps():
    nodes = list("abcdefgh")
    edges = [("a", "d"), ("b", "c"), ("a", "c"), ("c", "e"), ("a", "e"), ("d", "f"),
             ("b", "g"), ("g", "h"), ("e", "h"), ("f", "h")]
    sizes = {n: (40.0 + 10 * i, 20.0) for i, n in enumerate(nodes)}
    lay = layered_layout(nodes, edges, sizes)
    for (a, b), pts in zip(edges, lay.edges):
        assert lay.positions[a][1] < lay.positions[b][1]
        assert pts[0][1] < pts[-1][1] and len(pts) >= 2
    rows: dict[float, list] = {}
    for n, (x, y) in lay.positions.items():
        rows.setdefault(y, []).append((x - sizes[n][0] / 2, x + sizes[n][0] / 2))
    for boxes in rows.values():
        boxes.sort()
        assert all(a[1] < b[0] for a, b in zip(boxes, boxes[1:]))
    assert all(0 <= x - sizes[n][0] / 2 and x + sizes[n][0] / 2 <= lay.width
               for n, (x, _) in lay.positions.items())


def test_barycenter_ordering_removes_avoidable_crossings():
    # given in an order whose first layer crosses every edge of the second
    nodes = ["a1", "a2", "a3", "b1", "b2", "b3"]
    edges = [("a1", "b3"), ("a2", "b2"), ("a3", "b1")]
    lay = layered_layout(nodes, edges, {n: (30.0, 20.0) for n in nodes})
    assert count_crossings([["a1", "a2", "a3"], ["b1", "b2", "b3"]],
                           {"a1": ["b3"], "a2": ["b2"], "a3": ["b1"]}) == 3
    assert lay.crossings == 0
    xs = {n: lay.positions[n][0] for n in nodes}
    assert (xs["a1"] < xs["a2"]) == (xs["b3"] < xs["b2"])


# ============================================================================ in a browser

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--window-size=1400,900"]
#: collects the page's uncaught errors before any of its scripts run
ERROR_HOOK = ("window.__errors = [];"
              "window.addEventListener('error', function (e) {"
              " window.__errors.push(String(e.message)); });"
              "window.alert = function (m) { window.__errors.push('alert: ' + m); };")


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra")
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service
    chromium = shutil.which("chromium") or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    driver_exe = shutil.which("chromedriver") or (CHROMEDRIVER if os.path.exists(CHROMEDRIVER)
                                                  else None)
    if chromium is None or driver_exe is None:
        pytest.skip("no Chromium and ChromeDriver (apt-get install chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="d3viz-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in CHROME_ARGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        drv = webdriver.Chrome(service=Service(driver_exe), options=opts)
    except WebDriverException as exc:
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"Chromium did not start: {str(exc).splitlines()[0]}")
    drv.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": ERROR_HOOK})
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


def open_page(drv, path: str) -> None:
    drv.get("file://" + os.path.abspath(path))
    drv.get_log("browser")  # only this page's messages count from here


def assert_clean(drv) -> None:
    severe = [m for m in drv.get_log("browser") if m["level"] == "SEVERE"]
    assert not severe, severe
    assert drv.execute_script("return window.__errors") == []


@pytest.fixture(scope="module")
def mlp_page(tmp_path_factory):
    f = mlp()
    path = d3viz(f, str(tmp_path_factory.mktemp("d3viz") / "mlp.html"))
    return path, embedded(open(path, encoding="utf-8").read())


@pytest.mark.browser
def test_page_draws_every_node_without_errors(browser, mlp_page):
    path, data = mlp_page
    open_page(browser, path)
    drawn = browser.find_elements("css selector", "#graph g.node")
    assert len(drawn) == len(data["graphs"][0]["nodes"])
    assert len(browser.find_elements("css selector", "#graph path.edge")) == len(
        data["graphs"][0]["edges"])
    labels = {e.get_attribute("data-id") for e in drawn}
    assert labels == {n["id"] for n in data["graphs"][0]["nodes"]}
    assert_clean(browser)


@pytest.mark.browser
def test_clicking_the_slowest_node_shows_its_op_and_time(browser, mlp_page):
    path, data = mlp_page
    open_page(browser, path)
    top = max((n for n in data["graphs"][0]["nodes"] if n["op"]), key=lambda n: n["time"])
    browser.find_element("css selector", f'#graph g.node[data-id="{top["id"]}"]').click()
    panel = browser.find_element("id", "details").text
    assert top["op"] in panel and "per call" in panel and "time per call" in panel
    assert "selected" in browser.find_element(
        "css selector", f'#graph g.node[data-id="{top["id"]}"]').get_attribute("class")
    assert top["label"] in browser.find_element("id", "profile").text  # the slowest list
    assert_clean(browser)


@pytest.mark.browser
def test_search_highlights_the_matching_nodes(browser, mlp_page):
    path, data = mlp_page
    open_page(browser, path)
    want = {n["id"] for n in data["graphs"][0]["nodes"]
            if "gemm" in (n["label"] + " " + n["search"]).lower()}
    assert want
    box = browser.find_element("id", "search")
    box.send_keys("Gemm")
    hits = {e.get_attribute("data-id")
            for e in browser.find_elements("css selector", "#graph g.node.match")}
    assert hits == want
    assert browser.find_element("id", "matches").text.startswith(str(len(want)))
    box.clear()
    box.send_keys("no node is called this")
    assert not browser.find_elements("css selector", "#graph g.node.match")
    assert_clean(browser)


@pytest.mark.browser
def test_pan_and_zoom_move_the_view(browser, mlp_page):
    from selenium.webdriver.common.action_chains import ActionChains
    path, _ = mlp_page
    open_page(browser, path)
    view = browser.find_element("id", "viewport")
    before = view.get_attribute("transform")
    canvas = browser.find_element("id", "graph")
    ActionChains(browser).move_to_element_with_offset(canvas, 5, 5).click_and_hold() \
        .move_by_offset(60, 40).release().perform()
    panned = view.get_attribute("transform")
    assert panned != before
    browser.execute_script("arguments[0].dispatchEvent(new WheelEvent('wheel', {deltaY: -300, "
                           "clientX: 200, clientY: 200, bubbles: true, cancelable: true}))", canvas)
    zoomed = view.get_attribute("transform")
    scale = lambda t: float(re.search(r"scale\(([\d.e-]+)\)", t).group(1))  # noqa: E731
    assert scale(zoomed) > scale(panned)
    assert_clean(browser)


@pytest.mark.browser
def test_a_malicious_name_is_shown_as_text_in_the_browser(browser, tmp_path):
    x = T.vector(EVIL)
    f = function([x], T.exp(x), name=EVIL)
    open_page(browser, d3viz(f, str(tmp_path / "evil.html")))
    texts = [e.text for e in browser.find_elements("css selector", "#graph g.node text")]
    assert EVIL in texts
    assert browser.title.startswith(EVIL)
    assert_clean(browser)  # no alert ran (the hook records one as an error)


@pytest.mark.browser
def test_an_inner_graph_opens_on_double_click(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    data = page_data(ofg_function())
    path = str(tmp_path / "ofg.html")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(html_page(data))
    open_page(browser, path)
    holder = next(n for n in data["graphs"][0]["nodes"] if n["inner"])
    inner = next(g for g in data["graphs"] if g["id"] == holder["inner"][0][0])
    ActionChains(browser).double_click(browser.find_element(
        "css selector", f'#graph g.node[data-id="{holder["id"]}"]')).perform()
    assert len(browser.find_elements("css selector", "#graph g.node")) == len(inner["nodes"])
    crumbs = browser.find_elements("css selector", "#crumbs button")
    assert len(crumbs) == 2
    crumbs[0].click()  # back to the function's graph
    assert len(browser.find_elements("css selector", "#graph g.node")) == len(
        data["graphs"][0]["nodes"])
    assert_clean(browser)


def test_a_graph_too_deep_for_virtual_points_is_still_laid_out(monkeypatch):
    import symgpu.d3viz.layout as layout
    monkeypatch.setattr(layout, "POINTS_LIMIT", 0)  # long edges drawn straight
    nodes = [f"n{i}" for i in range(30)]
    edges = [(nodes[i], nodes[i + 1]) for i in range(29)] + [("n0", "n29"), ("n3", "n20")]
    lay = layout.layered_layout(nodes, edges, {n: (40.0, 20.0) for n in nodes})
    for (a, b), pts in zip(edges, lay.edges):
        assert lay.positions[a][1] < lay.positions[b][1]
        assert len(pts) == 2 or (a, b) in edges[:29]
