"""template.yaml is generated from template/ (template/generate.py says why):
the committed file is what the generator writes, and a change to the source
shows up as a difference."""

import copy
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("generate", ROOT / "template" / "generate.py")
generate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(generate)


def source_and_parts():
    return generate.SOURCE.read_text(), tomllib.loads(generate.PARTS.read_text())


def test_template_yaml_is_what_template_source_generates():
    assert (ROOT / "template.yaml").read_text() == generate.generate(), \
        "template.yaml differs from template/: edit template/, then run `python3 template/generate.py` (make template)"


def test_the_check_passes_as_a_command_on_the_committed_template():
    run = subprocess.run([sys.executable, "template/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_changed_table_changes_the_template():
    source, parts = source_and_parts()
    changed = copy.deepcopy(parts)
    changed["errors-alarms"]["scan"]["period"] = 900
    changed["dashboard"][0]["title"] = "Ingest"
    text = generate.render(source, changed)
    assert text != generate.render(source, parts)
    assert "  ScanErrorsAlarm:\n" in text and "      Period: 900\n" in text and '"title": "Ingest",' in text


def test_a_hand_edit_fails_the_check_with_a_diff(tmp_path, capsys):
    target = tmp_path / "template.yaml"
    assert generate.main([], target=target) == 0 and generate.main(["--check"], target=target) == 0
    target.write_text(target.read_text().replace("Threshold: 0", "Threshold: 1", 1))
    assert generate.main(["--check"], target=target) == 1
    assert "-      Threshold: 1\n+      Threshold: 0\n" in capsys.readouterr().out


def test_each_alarm_row_is_placed_once_and_unknown_keys_are_refused():
    source, parts = source_and_parts()
    extra = copy.deepcopy(parts)
    extra["errors-alarms"]["nothing"] = {}
    with pytest.raises(ValueError, match="placed once"):
        generate.render(source, extra)
    typo = copy.deepcopy(parts)
    typo["errors-alarms"]["load"] = {"periode": 60}
    with pytest.raises(ValueError, match="unknown keys"):
        generate.render(source, typo)
