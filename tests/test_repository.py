"""The repository's own shape: every relative link in README.md and docs/
points at a file (and heading) that exists; the core crate's modules depend
on each other without cycles, and no stage on another stage; no source file
is over 500 lines; the core crate's public surface stays narrow; and
docs/layout.md lists exactly the core crate's files."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "crates" / "event-store" / "src"
MAX_LINES = 500

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case,
    punctuation but `-` and `_` removed, spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "").lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set:
    seen, found = {}, set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(page: Path, root: Path = ROOT) -> list:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{page.relative_to(root)}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def test_anchors_follow_githubs_rules():
    assert slug("Why two tables") == "why-two-tables"
    assert slug("The HTTP API (`load`)") == "the-http-api-load"
    assert slug("4. Completeness: the watermark") == "4-completeness-the-watermark"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Here\n")
    page.write_text("[ok](b.md#here) [gone](c.md) [no heading](b.md#there) `[code](x.md)` [web](https://x)\n")
    assert broken_links(page, tmp_path) == ["a.md: c.md (no such file)", "a.md: b.md#there (no such heading)"]


def test_relative_links_in_the_readme_and_docs_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [line for page in pages for line in broken_links(page)]
    assert not broken, "\n".join(broken)


def module_of(path: Path, root: Path = CORE) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return "::".join(parts)


def dependencies(modules: dict) -> dict:
    """Module → the modules its code (tests and comments aside) names
    through `crate::` or `super::`, parents and children not counted."""

    def resolve(parts: list) -> str:
        for i in range(len(parts), 0, -1):
            name = "::".join(parts[:i])
            if name in modules:
                return name
        return ""

    def related(a: str, b: str) -> bool:
        a, b = a.split("::") if a else [], b.split("::") if b else []
        return a[: len(b)] == b or b[: len(a)] == a

    graph = {}
    for module, path in modules.items():
        code = re.sub(r"//.*", "", path.read_text())
        code = re.split(r"#\[cfg\(test\)\]\s*mod tests", code)[0]
        here = module.split("::") if module else []
        names = set()
        for kind, rest, group in re.findall(r"\b(crate|super)((?:::\w+)*)(?:::\{([^}]*)\})?", code):
            base = [] if kind == "crate" else here[:-1]
            prefix = base + [p for p in rest.split("::") if p]
            items = [i.strip().split(" ")[0] for i in group.split(",")] if group else [""]
            for item in items:
                tail = [p for p in item.split("::") if p and p != "self"]
                names.add(resolve(prefix + tail))
        graph[module] = {n for n in names if n and not related(module, n)}
    return graph


def cycles(graph: dict) -> list:
    """Each strongly connected group of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_core_crate_has_no_import_cycle():
    modules = {module_of(p): p for p in CORE.rglob("*.rs")}
    graph = dependencies(modules)
    assert "bookkeeping::lease" in graph and "position" in graph["bookkeeping::lease"], "the parser sees imports"
    files = cycles(graph)
    top = {}
    for module, names in graph.items():
        for name in names:
            a, b = module.split("::")[0], name.split("::")[0]
            if a != b:
                top.setdefault(a, set()).add(b)
    assert not files and not cycles(top), f"import cycles: {files or cycles(top)}"


# The stages, each a peer of the others: what one needs of another belongs in a
# floor below both (the log reader, bookkeeping, the readers' items, codecs, ...).
STAGES = ("load", "pump", "scan", "playback", "subscription", "entity", "archiver", "privacy::manage", "status")


def stage_of(module: str):
    for stage in STAGES:
        if module == stage or module.startswith(stage + "::"):
            return stage
    return None


def sideways(graph: dict) -> list:
    """Each import of one stage's module by another stage's."""
    found = []
    for module, names in graph.items():
        for name in names:
            a, b = stage_of(module), stage_of(name)
            if a and b and a != b:
                found.append(f"{module} -> {name}")
    return sorted(found)


def test_a_sideways_import_is_found():
    graph = {"load": {"http"}, "subscription::runner": {"log::reader", "playback::run"}, "privacy::door": {"crypto"}}
    assert sideways(graph) == ["subscription::runner -> playback::run"]
    assert sideways({"status": {"privacy::manage"}}) == ["status -> privacy::manage"]


def test_no_stage_imports_another_stage():
    modules = {module_of(p): p for p in CORE.rglob("*.rs")}
    graph = dependencies(modules)
    assert all(stage in graph for stage in STAGES), "every stage is a module"
    found = sideways(graph)
    assert not found, f"stages import each other (move what they share into a floor): {found}"


def source_files() -> list:
    """Every Rust file under a crate's or a function's src/, test-only files aside."""
    files = [*ROOT.glob("crates/*/src/**/*.rs"), *ROOT.glob("functions/*/src/**/*.rs")]
    return [p for p in files if p.name != "tests.rs" and "tests" not in p.relative_to(ROOT).parts[3:-1]]


def test_no_source_file_is_over_500_lines():
    files = source_files()
    assert CORE / "lib.rs" in files and ROOT / "crates" / "cli" / "src" / "main.rs" in files
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split by concept: {long}"


def public_fns(core: Path) -> tuple:
    """(`pub fn`s in the crate, those reachable from outside it): a function
    is reachable when every module around it is `pub mod` from the crate's
    root, or it is a method of a type a public module re-exports."""
    code = {}
    for p in core.rglob("*.rs"):
        if p.name != "tests.rs":
            code[module_of(p, core)] = re.split(r"#\[cfg\(test\)\]\s*mod tests", p.read_text())[0]
    public, grew = {""}, True
    while grew:
        grew = False
        for module in sorted(public):
            for name in re.findall(r"^\s*pub mod (\w+)\s*;", code.get(module, ""), re.M):
                child = f"{module}::{name}" if module else name
                if child in code and child not in public:
                    public.add(child)
                    grew = True
    reexported = set()
    for module in public:
        for group in re.findall(r"^\s*pub use ([^;]+);", code.get(module, ""), re.M):
            reexported.update(re.findall(r"\b([A-Z]\w*)\b", group))
    total = reachable = 0
    for module, text in code.items():
        depth, impl, impl_depth = 0, None, None
        for line in text.splitlines():
            opened = re.match(r"\s*impl(?:<[^>]*>)?\s+(?:[\w:]+(?:<[^>]*>)?\s+for\s+)?([\w:]+)", line)
            if opened and impl is None and line.rstrip().endswith("{"):
                impl, impl_depth = opened.group(1).split("::")[-1], depth
            if re.match(r"\s*pub (async |const |unsafe )*fn ", line):
                total += 1
                reachable += module in public or (impl is not None and impl in reexported)
            depth += line.count("{") - line.count("}")
            if impl is not None and depth <= impl_depth:
                impl = None
    return total, reachable


def test_the_public_surface_is_counted(tmp_path):
    (tmp_path / "lib.rs").write_text("pub mod a;\nmod b;\npub use b::Thing;\n")
    (tmp_path / "a.rs").write_text("pub fn one() {}\npub(crate) fn two() {}\n")
    (tmp_path / "b.rs").write_text("pub struct Thing;\nimpl Thing {\n    pub fn three() {}\n}\npub fn four() {}\n")
    assert public_fns(tmp_path) == (3, 2)


# 435 functions were reachable from outside the core crate before it was
# narrowed to what the CLI, the local stack, the bench and the tests use
# (issue 44); keep it at most half of that.
MAX_PUBLIC_FNS = 217


def test_the_core_crates_public_surface_stays_narrow():
    total, reachable = public_fns(CORE)
    print(f"core crate: {total} pub fns, {reachable} reachable from outside")
    assert reachable <= MAX_PUBLIC_FNS, f"{reachable} pub fns reachable from outside the core crate: make the rest pub(crate)"


def layout_entries(page: Path) -> set:
    """The core files docs/layout.md names: the `.rs` paths of its
    `crates/event-store/src/` block, relative to that directory."""
    text = page.read_text()
    block = text.split("crates/event-store/src/\n", 1)[1].split("```", 1)[0]
    return set(re.findall(r"[\w/]+\.rs\b", block))


def test_the_layout_page_names_every_core_file_and_no_other():
    listed = layout_entries(ROOT / "docs" / "layout.md")
    present = {str(p.relative_to(CORE)) for p in CORE.rglob("*.rs")}
    assert not present - listed, f"core files docs/layout.md does not name: {sorted(present - listed)}"
    assert not listed - present, f"docs/layout.md names files that do not exist: {sorted(listed - present)}"
