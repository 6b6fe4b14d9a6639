"""What the docs state about the template, checked against template.yaml:
the bookkeeping grants docs/storage.md lists are exactly the ones each
function's role holds under `dynamodb:LeadingKeys` conditions naming a
negative slot (a bookkeeping partition, or the quarantine)."""

import re
from pathlib import Path

from samtranslator.yaml_helper import yaml_parse

ROOT = Path(__file__).resolve().parent.parent


def bookkeeping_grants(template: dict) -> dict:
    """(function, slot) (`PumpFunction` → `pump`, `"-3"`) → the DynamoDB
    actions its role may use on that negative slot of the event table."""
    grants = {}
    for name, resource in template["Resources"].items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        for policy in resource.get("Properties", {}).get("Policies", []):
            for statement in policy.get("Statement", []) if isinstance(policy, dict) else []:
                if statement.get("Effect") != "Allow":
                    continue
                for operator, keys in statement.get("Condition", {}).items():
                    if operator not in ("ForAllValues:StringEquals", "ForAllValues:StringLike"):
                        continue
                    actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                    function = name.removesuffix("Function").lower()
                    for slot in keys.get("dynamodb:LeadingKeys", []):
                        if slot.startswith("-"):
                            grants.setdefault((function, slot), set()).update(a.removeprefix("dynamodb:") for a in actions)
    return grants


def documented_grants(page: Path) -> dict:
    """The table under "The roles write these partitions" in docs/storage.md:
    `| `function` | slot | `Action`, `Action` |` rows."""
    text = page.read_text().split("The roles write these partitions", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \| `?(-[\d?]+)`? \| ([^|]+) \|", text, re.M)
    return {(function, slot): set(re.findall(r"`(\w+)`", actions)) for function, slot, actions in rows}


def test_the_grants_are_read_from_a_role_and_a_row():
    template = {"Resources": {"PumpFunction": {"Type": "AWS::Serverless::Function", "Properties": {"Policies": [
        {"Statement": [
            {"Effect": "Allow", "Action": ["dynamodb:GetItem"], "Condition": {
                "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["-2", "-3"]}}},
            {"Effect": "Allow", "Action": ["dynamodb:BatchWriteItem"], "Condition": {
                "ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["-3", "0*"]}}},
            {"Effect": "Allow", "Action": ["dynamodb:Scan"]},
        ]}]}}}}
    assert bookkeeping_grants(template) == {("pump", "-2"): {"GetItem"}, ("pump", "-3"): {"GetItem", "BatchWriteItem"}}


def test_storage_md_lists_each_roles_bookkeeping_grants_as_the_template_grants_them():
    template = yaml_parse((ROOT / "template.yaml").read_text())
    granted = bookkeeping_grants(template)
    documented = documented_grants(ROOT / "docs" / "storage.md")
    assert granted, "the parser finds the template's grants"
    assert documented == granted, f"docs/storage.md says {documented}, the template grants {granted}"
