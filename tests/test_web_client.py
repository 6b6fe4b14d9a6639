"""The tracker script (clients/web): it type-checks under the pinned TypeScript, the committed
bundle is what the pinned esbuild makes of the source (so what the stack serves is what was
reviewed), it has no runtime dependency, and it stays within 2 KB gzipped."""

import base64
import gzip
import hashlib
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "clients" / "web"
BIN = ROOT / ".node" / "node_modules" / ".bin"
MAX_GZIPPED = 2048


def package():
    return json.loads((WEB / "package.json").read_text())


def bundle() -> Path:
    return WEB / package()["main"]


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{path} missing: run `make tools-node` (make test installs it)"
    return str(path)


def test_the_source_type_checks():
    run = subprocess.run([tool("tsc"), "-p", str(WEB)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_committed_bundle_is_what_the_source_builds(tmp_path):
    # The package's own build command, pointed at a scratch file.
    build = package()["scripts"]["build"].split()
    assert build[0] == "esbuild"
    out = tmp_path / "tracker.js"
    args = [tool("esbuild"), *[a if not a.startswith("--outfile=") else f"--outfile={out}" for a in build[1:]]]
    run = subprocess.run(args, cwd=WEB, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert out.read_bytes() == bundle().read_bytes(), "clients/web/dist differs from src: run `make web`"


def test_it_is_one_file_with_no_runtime_dependency_and_within_2_kb_gzipped():
    text = bundle().read_text()
    assert text.startswith('"use strict";(()=>{'), "one self-contained function, nothing global but window.es"
    assert "require(" not in text and "import " not in text and "import(" not in text
    assert not package().get("dependencies"), "no runtime dependency"
    size = len(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    print(f"tracker: {len(text)} bytes, {size} gzipped")
    assert size <= MAX_GZIPPED, f"{size} bytes gzipped: the limit is {MAX_GZIPPED}"


def test_the_bundle_is_named_by_the_package_version():
    assert bundle().name == f"et-{package()['version']}.js", "a versioned path: a new version is a new name"
    assert f"--outfile=dist/{bundle().name}" in package()["scripts"]["build"]


def test_the_stack_serves_this_version():
    """load serves the committed bundle at its versioned name (the template's route is checked
    against the same constant in crates/event-store/tests/template.rs)."""
    load = (ROOT / "crates" / "event-store" / "src" / "load.rs").read_text()
    assert f'TRACKER_SCRIPT: &str = "{bundle().name}"' in load
    assert f'include_str!("../../../clients/web/dist/{bundle().name}")' in load


def test_the_documented_integrity_hash_is_the_bundle_s():
    """A page pasting the docs' snippet loads exactly this build (Subresource Integrity)."""
    digest = "sha384-" + base64.b64encode(hashlib.sha384(bundle().read_bytes()).digest()).decode()
    for doc in [ROOT / "docs" / "clients.md", ROOT / "README.md"]:
        text = doc.read_text()
        assert f'/{bundle().name}"' in text and f'integrity="{digest}"' in text, f"{doc}: the snippet names {digest}"
