#!/usr/bin/env python3
"""Writes template.yaml from template/: template.src.yaml with its repeated parts filled in.

template.yaml has one errors alarm and one log group per function and a CloudWatch dashboard whose
body is some 400 lines of JSON. CloudFormation's Fn::ForEach could say each alarm
once, but neither the SAM translator nor moto's CloudFormation (which the
deployment tests deploy into) expands it, so the repetition is generated here, with
the Python standard library only. In template.src.yaml a line
`# generated: <part> [<name>...]` stands for a part, at that line's indentation;
parts.toml holds the parts' data. tests/test_template_source.py checks that the
committed template.yaml is what this writes.

    python3 template/generate.py           # rewrite template.yaml
    python3 template/generate.py --check   # exit 1 with a diff if template.yaml differs
"""

import argparse
import difflib
import json
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "template.src.yaml"
PARTS = HERE / "parts.toml"
TEMPLATE = HERE.parent / "template.yaml"
HEADER = "# Generated from template/ by `python3 template/generate.py` (make template): do not edit by hand.\n"
MARK = "# generated: "

ERRORS_ALARM = """\
{Name}ErrorsAlarm:
  Type: AWS::CloudWatch::Alarm{condition}
  Properties:
    AlarmDescription: {description}
    Namespace: AWS/Lambda
    MetricName: Errors
    Dimensions: [{{ Name: FunctionName, Value: !Ref {Name}Function }}]
    Statistic: Sum
    Period: {period}
    EvaluationPeriods: 1
    Threshold: 0
    ComparisonOperator: GreaterThanThreshold
    TreatMissingData: notBreaching
    AlarmActions: [!Ref AlarmTopic]"""


def errors_alarms(table: dict, names: list) -> str:
    """The <Name>ErrorsAlarm resources of these functions, a blank line between them."""
    alarms = []
    for name in names:
        row = {"description": f"{name} function errors.", "period": 300, "condition": None, **table[name]}
        if row.keys() != {"description", "period", "condition"}:
            raise ValueError(f"errors-alarms.{name}: unknown keys {sorted(set(row) - {'description', 'period', 'condition'})}")
        if ": " in row["description"] or " #" in row["description"]:
            raise ValueError(f"errors-alarms.{name}: the description would need YAML quotes")
        condition = f"\n  Condition: {row['condition']}" if row["condition"] else ""
        alarms.append(ERRORS_ALARM.format(Name=name.capitalize(), condition=condition,
                                          description=row["description"], period=row["period"]))
    return "\n\n".join(alarms)


LOG_GROUP = """\
{Name}LogGroup:
  Type: AWS::Logs::LogGroup{condition}
  Properties:
    # The stack's own name: Lambda made /aws/lambda/<function> in stacks deployed before, and
    # declaring that name would fail their update.
    LogGroupName: !Sub /event-store/${{Service}}-${{Stage}}/{name}
    RetentionInDays: !Ref LogRetentionDays"""


def log_groups(table: dict, names: list) -> str:
    """The <Name>LogGroup resources of these functions (under the condition their errors alarm has)."""
    groups = []
    for name in names:
        condition = table[name].get("condition")
        groups.append(LOG_GROUP.format(Name=name.capitalize(), name=name,
                                       condition=f"\n  Condition: {condition}" if condition else ""))
    return "\n\n".join(groups)


def dashboard(widgets: list) -> str:
    """The dashboard's body: its widgets as JSON, indented two spaces a level."""
    body = []
    for w in widgets:
        if not set(w) <= {"title", "at", "stat", "period", "lambda-metric", "functions", "metrics"}:
            raise ValueError(f"dashboard widget {w.get('title')!r}: unknown keys")
        per_function = [["AWS/Lambda", w["lambda-metric"], "FunctionName", f"${{{f.capitalize()}Function}}", {"label": f}]
                        for f in w.get("functions", [])]
        x, y, width, height = w["at"]
        body.append({"type": "metric", "x": x, "y": y, "width": width, "height": height, "properties": {
            "title": w["title"], "region": "${AWS::Region}", "view": "timeSeries", "stat": w["stat"],
            "period": w["period"], "metrics": per_function + w.get("metrics", [])}})
    return json.dumps({"widgets": body}, indent=2)


def render(source: str, parts: dict) -> str:
    """The template: HEADER in place of the source's leading comment, placeholders filled."""
    lines = source.split("\n")
    while lines[0].startswith("#"):
        lines.pop(0)
    out, placed, logged = [HEADER.rstrip("\n")], [], []
    for line in lines:
        if not line.lstrip().startswith(MARK):
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        part, *names = line.lstrip()[len(MARK):].split()
        if part == "errors-alarms":
            text = errors_alarms(parts["errors-alarms"], names)
            placed += names
        elif part == "log-groups":
            text = log_groups(parts["errors-alarms"], names)
            logged += names
        elif part == "dashboard":
            text = dashboard(parts["dashboard"])
        else:
            raise ValueError(f"unknown part in {line.strip()!r}")
        out += [indent + t if t else t for t in text.split("\n")]
    if sorted(placed) != sorted(parts["errors-alarms"]):
        raise ValueError(f"each of parts.toml's errors-alarms must be placed once: placed {placed}")
    if sorted(logged) != sorted(parts["errors-alarms"]):
        raise ValueError(f"each function (parts.toml's errors-alarms) needs its log group once: placed {logged}")
    return "\n".join(out)


def generate() -> str:
    return render(SOURCE.read_text(encoding="utf-8"), tomllib.loads(PARTS.read_text(encoding="utf-8")))


def main(argv=None, target: Path = TEMPLATE) -> int:
    parser = argparse.ArgumentParser(description="Write template.yaml from template/.")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff if template.yaml differs")
    args = parser.parse_args(argv)
    generated = generate()
    if not args.check:
        target.write_text(generated, encoding="utf-8", newline="")
        return 0
    current = target.read_text(encoding="utf-8") if target.exists() else ""
    if current == generated:
        return 0
    sys.stdout.writelines(difflib.unified_diff(current.splitlines(keepends=True), generated.splitlines(keepends=True),
                                               f"{target.name} (as it is)", f"{target.name} (generated from template/)"))
    print(f"\n{target.name} is not what template/ generates: edit template/, then run `python3 template/generate.py`",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
